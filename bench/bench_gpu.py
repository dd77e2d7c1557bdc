"""Throughput per batch size of one model on the CPU and on a GPU, in one run.

Serves the TorchScript digits classifier (appliance/demos/repository/digits_torch)
through the appliance: one appliance with two repository copies of it, one
on ``device = "cpu"`` and one on ``device = "cuda"``, driven by tritonclient
over gRPC with one request in flight. For each batch size the table shows
rows per second on each device; bench/results/gpu.json holds every repeat.
Without a usable GPU it says so and exits with 2. Usage::

    python bench/bench_gpu.py [--repeats N] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
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
MODEL = ROOT / "appliance" / "demos" / "repository" / "digits_torch"
BATCHES = (1, 8, 64)
DEVICES = ("cpu", "cuda")


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
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    missing = cuda_missing()
    if missing:
        print(f"bench_gpu: {missing}; run it on a host with a GPU", file=sys.stderr)
        return 2
    import torch
    import tritonclient.grpc as grpcclient

    repository = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    run_dir = new_run_dir()
    for device in DEVICES:
        shutil.copytree(MODEL, repository / f"digits_{device}")
        config = repository / f"digits_{device}" / "config.toml"
        config.write_text(f'device = "{device}"\n{config.read_text()}')
    config = make_config(run_dir, [])
    config["repositories"] = [{"path": str(repository)}]
    appliance = start(config, wait=False)
    runs: list[dict[str, Any]] = []
    try:
        appliance.wait_ready(240.0)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
        for batch in BATCHES:
            for device in DEVICES:
                for repeat in range(args.repeats):
                    rate = rows_per_s(client, f"digits_{device}", batch, args.seconds)
                    runs.append(
                        {"device": device, "batch": batch, "repeat": repeat, "rows_per_s": rate}
                    )
        client.close()
    finally:
        appliance.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(repository, ignore_errors=True)
    print(f"{'batch':>6} {'cpu rows/s':>12} {'cuda rows/s':>12} {'cuda/cpu':>9}")
    table = []
    for batch in BATCHES:
        medians = {
            device: statistics.median(
                r["rows_per_s"] for r in runs if r["device"] == device and r["batch"] == batch
            )
            for device in DEVICES
        }
        ratio = medians["cuda"] / medians["cpu"]
        table.append({"batch": batch, **medians, "ratio": ratio})
        print(f"{batch:>6} {medians['cpu']:>12.0f} {medians['cuda']:>12.0f} {ratio:>9.2f}")
    RESULTS.write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(0),
                "model": "digits_torch",
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
