"""Where a GPU pays, and KServe CUDA shared memory with and without a host round trip, in one run.

1. Crossover. Three TorchScript models, each served twice by one appliance,
   with ``device = "cpu"`` (one intra-op thread, the default) and
   ``device = "cuda"``, driven by tritonclient over KServe gRPC with one
   request in flight, at batch 1, 8 and 64: ``digits``
   (appliance/demos/repository/digits_torch, about 5,000 multiply-adds a
   row, so small that a request's trip outweighs its compute), ``conv``
   (four convolutions over a 3 x 64 x 64 image, about 40 million a row) and
   ``wide`` (digits' interface with three hidden layers of WIDE_UNITS units,
   about 34 million a row and 34 million weights). Weights are random, made
   here with torch: only the arithmetic matters. The table gives rows per
   second on each device and the batch from which the GPU pays.

2. CUDA shared memory. A TorchScript model on the GPU that doubles a 16 MiB
   FP32 tensor, its input and output in the client's CUDA regions
   (tritonclient's helpers), timed per request over KServe gRPC on two
   appliances: ``shm.cuda_copies = "model_worker"`` (the default: the model
   worker reads and writes the client's GPU memory in place) and
   ``"frontend"`` (the frontend copies through host memory, as before). With
   each, the GPU memory that processes other than model workers hold, per
   nvidia-smi.

bench/results/gpu.json holds every repeat; the GPU table of docs/performance.md
(between the ``bench-gpu`` markers) is rewritten. Without a usable GPU it says so and
exits with 2. Usage::

    python bench/bench_gpu.py [--repeats N] [--seconds S] [--requests N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.doc_tables import PAGE, update  # noqa: E402
from tests.gpu import cuda_missing, cudashm_missing, gpu_processes  # noqa: E402
from tests.system.harness import Appliance, make_config, new_run_dir, start  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gpu.json"
DIGITS = ROOT / "appliance" / "demos" / "repository" / "digits_torch"
BATCHES = (1, 8, 64)
DEVICES = ("cpu", "cuda")
WIDE_UNITS = 4096
# (input name, shape of one row) of each model; every output is "probabilities" [-1, 10].
MODELS = {"digits": ("pixels", (64,)), "conv": ("images", (3, 64, 64)), "wide": ("pixels", (64,))}
# The CUDA shared-memory model: 16 MiB of FP32 in and out.
BIG_SHAPE = (1024, 4096)
BIG_BYTES = BIG_SHAPE[0] * BIG_SHAPE[1] * 4
COPIES = ("model_worker", "frontend")


def save(module: Any, folder: Path, config: str) -> None:
    import torch

    (folder / "1").mkdir(parents=True)
    torch.jit.script(module.eval()).save(str(folder / "1" / "model.pt"))
    (folder / "config.toml").write_text(config)


def classifier(name: str, shape: tuple[int, ...]) -> str:
    dims = ", ".join(str(d) for d in shape)
    return (
        f'[[inputs]]\nname = "{name}"\ndtype = "FP32"\nshape = [-1, {dims}]\n\n'
        '[[outputs]]\nname = "probabilities"\ndtype = "FP32"\nshape = [-1, 10]\n'
    )


def make_models(repository: Path) -> None:
    """Write conv, wide and the 16 MiB doubler (digits is the demo's)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    width = 64
    for _ in range(3):
        layers += [nn.Linear(width, WIDE_UNITS), nn.ReLU()]
        width = WIDE_UNITS
    layers += [nn.Linear(width, 10), nn.Softmax(dim=1)]
    save(nn.Sequential(*layers), repository / "wide", classifier("pixels", (64,)))
    conv = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
        nn.Softmax(dim=1),
    )
    save(conv, repository / "conv", classifier("images", (3, 64, 64)))

    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0

    dims = ", ".join(str(d) for d in BIG_SHAPE)
    save(
        Double(),
        repository / "big",
        f'device = "cuda"\n[[inputs]]\nname = "x"\ndtype = "FP32"\nshape = [{dims}]\n\n'
        f'[[outputs]]\nname = "y"\ndtype = "FP32"\nshape = [{dims}]\n',
    )


def rows_per_s(
    client: Any, model: str, name: str, row: tuple[int, ...], batch: int, seconds: float
) -> float:
    import tritonclient.grpc as grpcclient

    data = np.random.default_rng(0).random((batch, *row), dtype=np.float32)
    tensor = grpcclient.InferInput(name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    for _ in range(5):  # warm-up: CUDA kernels load on first use
        client.infer(model, [tensor])
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        client.infer(model, [tensor])
        count += 1
    return count * batch / (time.perf_counter() - began)


@contextmanager
def serving(repository: Path, **shm: Any) -> Iterator[Appliance]:
    run_dir = new_run_dir()
    # The default rings (the tests' are smaller): 16 MiB tensors fit them.
    rings = {"request_ring_bytes": 32 << 20, "response_ring_bytes": 32 << 20}
    config = make_config(run_dir, [], shm={**rings, **shm})
    config["repositories"] = [{"path": str(repository)}]
    appliance = start(config, wait=False)
    try:
        appliance.wait_ready(240.0)
        yield appliance
    finally:
        appliance.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def crossover(repository: Path, repeats: int, seconds: float) -> list[dict[str, Any]]:
    import tritonclient.grpc as grpcclient

    for model, device in itertools.product(MODELS, DEVICES):
        source = DIGITS if model == "digits" else repository / model
        shutil.copytree(source, repository / "served" / f"{model}_{device}")
        config = repository / "served" / f"{model}_{device}" / "config.toml"
        config.write_text(f'device = "{device}"\n{config.read_text()}')
    runs: list[dict[str, Any]] = []
    with serving(repository / "served") as appliance:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
        try:
            for (model, (name, row)), batch, device in itertools.product(
                MODELS.items(), BATCHES, DEVICES
            ):
                for repeat in range(repeats):
                    rate = rows_per_s(client, f"{model}_{device}", name, row, batch, seconds)
                    runs.append(
                        {
                            "model": model,
                            "device": device,
                            "batch": batch,
                            "repeat": repeat,
                            "rows_per_s": rate,
                        }
                    )
                    print(f"  {model:>6} {device:>4} batch {batch:>2}: {rate:10.0f} rows/s")
        finally:
            client.close()
    return runs


def held_by_others(appliance: Appliance) -> int | None:
    """MiB of GPU memory held by the appliance's processes that are not model workers."""
    held = gpu_processes()
    if held is None:
        return None
    master = psutil.Process(appliance.process.pid)
    tree = {master.pid, *(child.pid for child in master.children(recursive=True))}
    workers = {p["pid"] for p in appliance.processes() if p["role"].startswith("model")}
    return sum(used for pid, used in held.items() if pid in tree - workers)


def cuda_shm(repository: Path, copies: str, requests: int) -> dict[str, Any]:
    """Latencies of the 16 MiB model with its tensors in CUDA regions, one appliance."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import cuda_shared_memory as cudashm

    served = repository / f"shm-{copies}"
    shutil.copytree(repository / "big", served / "big")
    data = np.random.default_rng(1).random(BIG_SHAPE, dtype=np.float32)
    with serving(served, cuda_copies=copies) as appliance:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
        inputs = cudashm.create_shared_memory_region("x", BIG_BYTES, 0)
        outputs = cudashm.create_shared_memory_region("y", BIG_BYTES, 0)
        try:
            cudashm.set_shared_memory_region(inputs, [data])
            client.unregister_cuda_shared_memory()
            client.register_cuda_shared_memory("x", cudashm.get_raw_handle(inputs), 0, BIG_BYTES)
            client.register_cuda_shared_memory("y", cudashm.get_raw_handle(outputs), 0, BIG_BYTES)
            tensor = grpcclient.InferInput("x", list(BIG_SHAPE), "FP32")
            tensor.set_shared_memory("x", BIG_BYTES)
            wanted = grpcclient.InferRequestedOutput("y")
            wanted.set_shared_memory("y", BIG_BYTES)
            latencies = []
            for index in range(requests + 10):
                began = time.perf_counter()
                client.infer("big", [tensor], outputs=[wanted])
                if index >= 10:  # warm-up first
                    latencies.append((time.perf_counter() - began) * 1000)
            got = cudashm.get_contents_as_numpy(outputs, np.float32, list(BIG_SHAPE))
            if not np.array_equal(got, data * 2):
                raise RuntimeError(f"cuda_copies={copies}: the output region holds wrong values")
            frontends_mib = held_by_others(appliance)
            client.unregister_cuda_shared_memory()
        finally:
            cudashm.destroy_shared_memory_region(inputs)
            cudashm.destroy_shared_memory_region(outputs)
            client.close()
    latencies.sort()
    return {
        "copies": copies,
        "requests": requests,
        "p50_ms": statistics.median(latencies),
        "p90_ms": latencies[int(0.9 * (len(latencies) - 1))],
        "frontend_gpu_mib": frontends_mib,
        "latencies_ms": latencies,
    }


def table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for model, batch in itertools.product(MODELS, BATCHES):
        medians = {
            device: statistics.median(
                r["rows_per_s"]
                for r in runs
                if (r["model"], r["device"], r["batch"]) == (model, device, batch)
            )
            for device in DEVICES
        }
        rows.append(
            {"model": model, "batch": batch, **medians, "ratio": medians["cuda"] / medians["cpu"]}
        )
    return rows


def pays_from(rows: list[dict[str, Any]], model: str) -> int | None:
    """The smallest batch from which the GPU serves more rows per second, None if none."""
    paying = [r["batch"] for r in rows if r["model"] == model and r["ratio"] > 1.0]
    return min(paying) if paying else None


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['gpu']}, {result['cpus']} CPUs, {result['when']}: KServe gRPC, one request in "
        "flight, TorchScript, CPU rows with one intra-op thread (the default); medians of "
        f"{result['repeats']} runs of {result['seconds']:g} s (`bench/bench_gpu.py`).",
        "",
        "| model | multiply-adds a row | batch | CPU rows/s | GPU rows/s | GPU / CPU |",
        "|---|---|---|---|---|---|",
    ]
    size = {"digits": "~5 thousand", "conv": "~40 million", "wide": "~34 million"}
    for row in result["table"]:
        lines.append(
            f"| {row['model']} | {size[row['model']]} | {row['batch']} | {row['cpu']:,.0f} | "
            f"{row['cuda']:,.0f} | {row['ratio']:.2f}x |"
        )
    paying = ", ".join(
        f"{model} from batch {batch}" if batch else f"{model} at none of the batches measured"
        for model, batch in result["pays_from"].items()
    )
    lines += ["", f"The GPU pays: {paying}."]
    shm = result.get("cuda_shm")
    if shm:
        new, old = shm["model_worker"], shm["frontend"]
        lines += [
            "",
            "KServe CUDA shared memory, 16 MiB FP32 in and out (x * 2 on the GPU), "
            f"{new['requests']} sequential requests over gRPC:",
            "",
            "| `shm.cuda_copies` | p50 ms | p90 ms | GPU memory held by frontend processes |",
            "|---|---|---|---|",
        ]
        for entry in (new, old):
            held = entry["frontend_gpu_mib"]
            lines.append(
                f"| {entry['copies']} | {entry['p50_ms']:.2f} | {entry['p90_ms']:.2f} | "
                f"{'n/a (no nvidia-smi)' if held is None else f'{held} MiB'} |"
            )
        lines += ["", f"p50 ratio, model_worker / frontend: {shm['p50_ratio']:.2f}x."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    missing = cuda_missing()
    if missing:
        print(f"bench_gpu: {missing}; run it on a host with a GPU", file=sys.stderr)
        return 2
    import torch

    repository = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "cpus": len(os.sched_getaffinity(0)),
        "when": time.strftime("%Y-%m-%d"),
        "wide_units": WIDE_UNITS,
        "repeats": args.repeats,
        "seconds": args.seconds,
    }
    try:
        make_models(repository)
        print("crossover: rows per second, CPU and GPU")
        runs = crossover(repository, args.repeats, args.seconds)
        result["table"] = table(runs)
        result["pays_from"] = {model: pays_from(result["table"], model) for model in MODELS}
        result["runs"] = runs
        if cudashm_missing():
            print(f"cuda_shm: skipped ({cudashm_missing()})")
        else:
            shm = {copies: cuda_shm(repository, copies, args.requests) for copies in COPIES}
            shm["p50_ratio"] = shm["model_worker"]["p50_ms"] / shm["frontend"]["p50_ms"]
            result["cuda_shm"] = shm
    finally:
        shutil.rmtree(repository, ignore_errors=True)
    print(f"\n{'model':>7} {'batch':>6} {'cpu rows/s':>12} {'cuda rows/s':>12} {'cuda/cpu':>9}")
    for row in result["table"]:
        print(
            f"{row['model']:>7} {row['batch']:>6} {row['cpu']:>12.0f} {row['cuda']:>12.0f} "
            f"{row['ratio']:>9.2f}"
        )
    print(f"the GPU pays from batch: {result['pays_from']}")
    if "cuda_shm" in result:
        for copies in COPIES:
            entry = result["cuda_shm"][copies]
            print(
                f"cuda shm 16 MiB, copies in {copies:>12}: p50 {entry['p50_ms']:.2f} ms, "
                f"p90 {entry['p90_ms']:.2f} ms, frontends hold {entry['frontend_gpu_mib']} MiB"
            )
        print(f"p50 ratio model_worker / frontend: {result['cuda_shm']['p50_ratio']:.3f}")
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    update(PAGE, render(result), "bench-gpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
