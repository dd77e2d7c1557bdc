"""Ensembles over KServe gRPC: a chain of three ``identity`` steps against one ``identity`` call.

One client process (tritonclient.grpc, one request in flight) calls, in
turn within each repeat:

- ``single``: ``identity``, as bench_kserve.py does;
- ``chain``: ``identity_chain``, an ensemble of three ``identity`` steps
  (the default ``identity``: it passes its input through, so the chain moves
  descriptors and never a byte between steps);
- ``single_copy`` / ``chain_copy``: the same with ``identity_copy``, which
  copies its output into its own response ring (``passthrough = false``):
  each step's output then lies in that worker's ring, where the next step
  reads it in place.

at 16 B and 1 MiB of FP32. The targets (issue 35): the chain's p50 at most
1.3x one call and its server CPU per request at most 1.5x at 1 MiB, its p50
at most 2x at 16 B. Server CPU is the whole process tree's (psutil). The
table shows medians over repeats; bench/results/ensemble.json holds every
repeat. The machine is shared: the run waits (up to --wait-s) for the
1-minute load to fall below --max-load before it starts, and records it.
Usage::

    python bench/bench_ensemble.py [--seconds S] [--repeats R] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loadgen import (  # noqa: E402
    ClientPool,
    ProcessTree,
    median_row,
    mode_call,
    write_results,
)
from tests.system.harness import running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ensemble.json"
MiB = 1 << 20
SIZES = {"16B": 16, "1MiB": MiB}
# mode -> the model it calls
MODES = {
    "single": "identity",
    "chain": "identity_chain",
    "single_copy": "identity_copy",
    "chain_copy": "identity_copy_chain",
}
IDENTITY = "appliance.demos.identity:Identity"
TENSOR = {"dtype": "FP32", "shape": [-1, -1]}


def chain(name: str, model: str) -> dict[str, Any]:
    """An ensemble of three steps of ``model``: INPUT0 -> a -> b -> OUTPUT0."""
    links = [("INPUT0", "a"), ("a", "b"), ("b", "OUTPUT0")]
    return {
        "name": name,
        "platform": "ensemble",
        "inputs": [{"name": "INPUT0", **TENSOR}],
        "outputs": [{"name": "OUTPUT0", **TENSOR}],
        "steps": [
            {"model": model, "input_map": {"INPUT0": src}, "output_map": {"OUTPUT0": dst}}
            for src, dst in links
        ],
    }


MODELS = [
    {"name": "identity", "class": IDENTITY},
    {"name": "identity_copy", "class": IDENTITY, "passthrough": False},
    chain("identity_chain", "identity"),
    chain("identity_copy_chain", "identity_copy"),
]


class Caller:
    """One client process's gRPC client."""

    def __init__(self, ports: dict[str, int]) -> None:
        import tritonclient.grpc as grpcclient

        self.grpcclient = grpcclient
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")

    def call(self, mode: str, x: np.ndarray) -> None:
        value = self.grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        value.set_data_from_numpy(x)
        y = self.grpc.infer(MODES[mode], [value]).as_numpy("OUTPUT0")
        if y.shape != x.shape or y[0, -1] != x[0, -1]:
            raise AssertionError(f"{mode} returned other data than it was sent")

    def close(self) -> None:
        self.grpc.close()


def wait_for_quiet(max_load: float, wait_s: float) -> float:
    """Wait until the 1-minute load is below ``max_load`` (at most ``wait_s``); return it."""
    deadline = time.monotonic() + wait_s
    while True:
        load = os.getloadavg()[0]
        if load < max_load or time.monotonic() > deadline:
            return load
        print(f"1-minute load {load:.2f} >= {max_load}; waiting", file=sys.stderr)
        time.sleep(15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-load", type=float, default=1.5)
    parser.add_argument("--wait-s", type=float, default=900.0)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeats, args.wait_s = 0.5, 1, 0.0
    load_before = wait_for_quiet(args.max_load, args.wait_s)
    # One gRPC process: every call of every mode goes through the same frontend.
    sections = {"grpc": {"workers": 1}, "shm": {"response_ring_bytes": 64 * MiB}}
    with (
        running(MODELS, **sections) as appliance,
        ClientPool(1, functools.partial(mode_call, Caller)) as pool,
    ):
        server = ProcessTree(appliance.process.pid)
        runs = measure(pool, (appliance.ports,), args, server)
    load_after = os.getloadavg()[0]
    summary = summarise(runs)
    report(summary, load_before, load_after)
    write_results(
        RESULTS,
        seconds=args.seconds,
        repeats=args.repeats,
        load_1min=[round(load_before, 2), round(load_after, 2)],
        summary=summary,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


def measure(
    pool: ClientPool, caller_args: tuple[Any, ...], args: argparse.Namespace, server: ProcessTree
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every mode and size, one request in flight; repeats outermost, so modes interleave."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {s: [] for s in SIZES} for m in MODES}
    for repeat in range(args.repeats):
        print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
        for size, nbytes in SIZES.items():
            for mode in MODES:
                row = pool.measure((mode, nbytes, *caller_args), 1, args.seconds, server)
                if row["errors"]:
                    raise RuntimeError(f"{mode} {size}: {row['error']}")
                runs[mode][size].append(row)
    return runs


def summarise(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    table = {
        mode: {size: median_row(repeats) for size, repeats in by_size.items()}
        for mode, by_size in runs.items()
    }
    ratios = {}
    for size in SIZES:
        for chained, single in (("chain", "single"), ("chain_copy", "single_copy")):
            a, b = table[chained][size], table[single][size]
            ratios[f"{chained}/{single} {size}"] = {
                "p50": a["p50_ms"] / b["p50_ms"],
                "server_cpu": a["server_cpu_us"] / b["server_cpu_us"],
            }
    return {"by_mode": table, "ratios": ratios}


def report(summary: dict[str, Any], load_before: float, load_after: float) -> None:
    print(
        f"\nKServe gRPC, one request in flight, medians over repeats "
        f"(1-minute load {load_before:.2f} before, {load_after:.2f} after)"
    )
    print("| mode | size | p50 ms | p99 ms | req/s | server CPU µs/req |")
    print("|---|---|---|---|---|---|")
    for mode, by_size in summary["by_mode"].items():
        for size, row in by_size.items():
            print(
                f"| {mode} | {size} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
                f"{row['rps']:.0f} | {row['server_cpu_us']:.0f} |"
            )
    print("\n| ratio | p50 | server CPU |")
    print("|---|---|---|")
    for name, row in summary["ratios"].items():
        print(f"| {name} | {row['p50']:.2f}x | {row['server_cpu']:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
