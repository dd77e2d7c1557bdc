"""Throughput per batch size of TorchScript models on the CPU and on a GPU, in one run.

Two models, each served twice by one appliance, with ``device = "cpu"`` and
``device = "cuda"``, driven by tritonclient over gRPC with one request in
flight: the digits classifier (appliance/demos/repository/digits_torch), so
small that a request's trip through the appliance outweighs its compute, and
``wide``, the same interface with three hidden layers of WIDE_UNITS units
(random weights, made here with torch: only the arithmetic matters), where
the compute dominates. For each model and batch size the table shows rows
per second on each device; bench/results/gpu.json holds every repeat.
Without a usable GPU it says so and exits with 2. Usage::

    python bench/bench_gpu.py [--repeats N] [--seconds S]
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
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gpu import cuda_missing  # noqa: E402
from tests.system.harness import make_config, new_run_dir, start  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gpu.json"
DIGITS = ROOT / "appliance" / "demos" / "repository" / "digits_torch"
MODELS = ("digits", "wide")
BATCHES = (1, 8, 64)
DEVICES = ("cpu", "cuda")
WIDE_UNITS = 4096


def make_wide(folder: Path) -> None:
    """Write the ``wide`` model: digits' interface, 3 x WIDE_UNITS hidden units."""
    import torch

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    width = 64
    for _ in range(3):
        layers += [torch.nn.Linear(width, WIDE_UNITS), torch.nn.ReLU()]
        width = WIDE_UNITS
    layers += [torch.nn.Linear(width, 10), torch.nn.Softmax(dim=1)]
    scripted = torch.jit.script(torch.nn.Sequential(*layers).eval())
    (folder / "1").mkdir(parents=True)
    scripted.save(str(folder / "1" / "model.pt"))
    shutil.copy(DIGITS / "config.toml", folder / "config.toml")


def rows_per_s(client: Any, model: str, batch: int, seconds: float) -> float:
    import tritonclient.grpc as grpcclient

    pixels = np.random.default_rng(0).random((batch, 64), dtype=np.float32)
    tensor = grpcclient.InferInput("pixels", [batch, 64], "FP32")
    tensor.set_data_from_numpy(pixels)
    for _ in range(10):  # warm-up: CUDA kernels load on first use
        client.infer(model, [tensor])
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        client.infer(model, [tensor])
        count += 1
    return count * batch / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    missing = cuda_missing()
    if missing:
        print(f"bench_gpu: {missing}; run it on a host with a GPU", file=sys.stderr)
        return 2
    import torch
    import tritonclient.grpc as grpcclient

    repository = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    run_dir = new_run_dir()
    make_wide(repository / "wide")
    for model, source in (("digits", DIGITS), ("wide", repository / "wide")):
        for device in DEVICES:
            shutil.copytree(source, repository / f"{model}_{device}")
            config = repository / f"{model}_{device}" / "config.toml"
            config.write_text(f'device = "{device}"\n{config.read_text()}')
    shutil.rmtree(repository / "wide")
    config = make_config(run_dir, [])
    config["repositories"] = [{"path": str(repository)}]
    appliance = start(config, wait=False)
    runs: list[dict[str, Any]] = []
    try:
        appliance.wait_ready(240.0)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
        for model, batch, device in itertools.product(MODELS, BATCHES, DEVICES):
            for repeat in range(args.repeats):
                rate = rows_per_s(client, f"{model}_{device}", batch, args.seconds)
                runs.append(
                    {
                        "model": model,
                        "device": device,
                        "batch": batch,
                        "repeat": repeat,
                        "rows_per_s": rate,
                    }
                )
        client.close()
    finally:
        appliance.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(repository, ignore_errors=True)
    print(f"{'model':>7} {'batch':>6} {'cpu rows/s':>12} {'cuda rows/s':>12} {'cuda/cpu':>9}")
    table = []
    for model, batch in itertools.product(MODELS, BATCHES):
        medians = {
            device: statistics.median(
                r["rows_per_s"]
                for r in runs
                if (r["model"], r["device"], r["batch"]) == (model, device, batch)
            )
            for device in DEVICES
        }
        ratio = medians["cuda"] / medians["cpu"]
        table.append({"model": model, "batch": batch, **medians, "ratio": ratio})
        print(
            f"{model:>7} {batch:>6} {medians['cpu']:>12.0f} {medians['cuda']:>12.0f} {ratio:>9.2f}"
        )
    RESULTS.write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(0),
                "cpus": len(os.sched_getaffinity(0)),
                "wide_units": WIDE_UNITS,
                "seconds": args.seconds,
                "table": table,
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
