"""The internal data path: client -> identity model worker -> client.

Measures round trips at 64 B, 64 KiB, 1 MiB and 16 MiB with 1 and 4 requests
in flight, through two models: ``identity`` as served (its output is its
input, so the worker passes it through without a copy: one copy in all) and
the same model with ``passthrough = false`` (the general path: the output is
copied once into the worker's response ring, two copies in all). In the same
run, two references:

- the two-copy limit: two numpy copies of the same bytes (what the path
  must do at least: into the request ring, then into the response ring);
- the same round trip through ``multiprocessing.Queue`` to a worker process
  (what a plain Python pool does: pickles through pipes).

Each configuration is repeated; the table shows medians over repeats, and
bench/results/internal.json holds every repeat. Usage::

    python bench/bench_internal.py [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loadgen import tensor, thread_loop, write_results  # noqa: E402
from tests.system.harness import demo_models, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "internal.json"
MiB = 1 << 20
SIZES = {"64B": 64, "64KiB": 64 << 10, "1MiB": MiB, "16MiB": 16 * MiB}
# Requests per measurement, per size: enough for stable medians, bounded in time.
COUNTS = {"64B": 3000, "64KiB": 2000, "1MiB": 600, "16MiB": 40}
QUEUE_COUNTS = {"64B": 2000, "64KiB": 1000, "1MiB": 100, "16MiB": 10}
TARGETS = {
    "p50_64B_us": 120.0,
    "p50_1MiB_us": 250.0,
    "ratio_16MiB_vs_two_copies": 1.25,
    "copying_ratio_16MiB_vs_two_copies": 1.25,
    "speedup_16MiB_vs_queue": 15.0,
}


def closed_loop(
    call: Callable[[np.ndarray, int], None], x: np.ndarray, count: int, inflight: int
) -> dict[str, float]:
    """Run ``count`` calls from ``inflight`` threads after a tenth as many to warm up.

    ``call(x, i)`` is told which thread (0..inflight-1) it runs in.
    """
    warmup = max(1, count // 10 // inflight)
    row = thread_loop(lambda index: lambda: call(x, index), count, inflight, warmup)
    row["gbps"] = row["requests"] * x.nbytes / row["elapsed_s"] / 1e9
    return row


def two_copies(nbytes: int, repeats: int = 7) -> float:
    """Median seconds for two numpy copies of ``nbytes`` (pre-faulted buffers)."""
    src = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
    a = np.empty_like(src)
    b = np.empty_like(src)
    a[:] = 0
    b[:] = 0
    loops = max(3, int(2e8 // max(nbytes, 1)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            np.copyto(a, src)
            np.copyto(b, a)
        times.append((time.perf_counter() - start) / loops)
    return statistics.median(times)


def _queue_worker(inbox: Any, outboxes: list[Any]) -> None:
    while True:
        item = inbox.get()
        if item is None:
            return
        index, array = item
        outboxes[index].put(array)


def queue_path(
    sizes: dict[str, int], counts: dict[str, int], inflight: int
) -> dict[str, dict[str, float]]:
    """Round trips through multiprocessing.Queue to an identity process."""
    context = mp.get_context("spawn")
    inbox = context.Queue()
    outboxes = [context.Queue() for _ in range(inflight)]
    process = context.Process(target=_queue_worker, args=(inbox, outboxes), daemon=True)
    process.start()

    def call(x: np.ndarray, index: int) -> None:
        inbox.put((index, x))
        y = outboxes[index].get()
        if y.shape != x.shape:
            raise AssertionError("the queue worker returned other data")

    try:
        results = {}
        for name, nbytes in sizes.items():
            results[name] = closed_loop(call, tensor(nbytes), counts[name], inflight)
        return results
    finally:
        inbox.put(None)
        process.join(10)
        if process.is_alive():
            process.kill()


def appliance_path(
    client: Any, model: str, sizes: dict[str, int], counts: dict[str, int], inflight: int
) -> dict[str, dict[str, float]]:
    def call(x: np.ndarray, _index: int) -> None:
        with client.infer(model, {"INPUT0": x}) as result:
            y = result.array("OUTPUT0")
            if y.shape != x.shape or y[0, 0] != x[0, 0] or y[0, -1] != x[0, -1]:
                raise AssertionError(f"{model} returned other data than it was sent")

    results = {}
    for name, nbytes in sizes.items():
        results[name] = closed_loop(call, tensor(nbytes), counts[name], inflight)
    return results


def median_of(runs: list[dict[str, dict[str, float]]], size: str, key: str) -> float:
    return statistics.median(run[size][key] for run in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer requests, for a smoke run")
    args = parser.parse_args()
    counts = {k: max(10, v // 10) for k, v in COUNTS.items()} if args.quick else COUNTS
    qcounts = {k: max(4, v // 10) for k, v in QUEUE_COUNTS.items()} if args.quick else QUEUE_COUNTS
    shm = {"request_ring_bytes": 160 * MiB, "response_ring_bytes": 160 * MiB}
    http = {"workers": 1}
    paths = ("appliance", "copying", "queue")
    runs: dict[str, list[Any]] = {f"{p}_{n}": [] for p in paths for n in (1, 4)}
    models = [
        *demo_models("identity"),
        {"name": "copying", "class": "appliance.demos.identity:Identity", "passthrough": False},
    ]
    with running(models, shm=shm, http=http, grpc={"workers": 1}) as appliance:
        client = appliance.client(ring_bytes=160 * MiB)
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
            for inflight in (1, 4):
                for path, model in (("appliance", "identity"), ("copying", "copying")):
                    runs[f"{path}_{inflight}"].append(
                        appliance_path(client, model, SIZES, counts, inflight)
                    )
                runs[f"queue_{inflight}"].append(queue_path(SIZES, qcounts, inflight))
    copies = {name: two_copies(nbytes) for name, nbytes in SIZES.items()}
    summary = summarise(runs, copies)
    report(summary)
    write_results(
        RESULTS,
        repeats=args.repeats,
        two_copy_seconds=copies,
        summary=summary,
        targets=TARGETS,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


def summarise(runs: dict[str, list[Any]], copies: dict[str, float]) -> dict[str, Any]:
    table = {}
    for size in SIZES:
        row: dict[str, float] = {"two_copies_us": copies[size] * 1e6}
        for path in runs:
            for key in ("p50_us", "p99_us", "gbps", "rps"):
                row[f"{path}_{key}"] = median_of(runs[path], size, key)
        row["ratio_vs_two_copies"] = row["appliance_1_p50_us"] / row["two_copies_us"]
        row["copying_ratio_vs_two_copies"] = row["copying_1_p50_us"] / row["two_copies_us"]
        row["speedup_vs_queue_1"] = row["queue_1_p50_us"] / row["appliance_1_p50_us"]
        row["speedup_vs_queue_4"] = row["appliance_4_gbps"] / row["queue_4_gbps"]
        table[size] = row
    checks = {
        "p50_64B_us": table["64B"]["appliance_1_p50_us"],
        "p50_1MiB_us": table["1MiB"]["appliance_1_p50_us"],
        "ratio_16MiB_vs_two_copies": table["16MiB"]["ratio_vs_two_copies"],
        "copying_ratio_16MiB_vs_two_copies": table["16MiB"]["copying_ratio_vs_two_copies"],
        "speedup_16MiB_vs_queue": table["16MiB"]["speedup_vs_queue_1"],
    }
    return {"by_size": table, "checks": checks}


def report(summary: dict[str, Any]) -> None:
    print("\nidentity (pass-through: 1 copy) | copying (passthrough=false: 2 copies) | queue")
    print(
        f"{'size':>6} {'2 copies':>9} {'p50 1':>8} {'p99 1':>8} {'GB/s 1':>7} {'GB/s 4':>7} "
        f"{'cp p50 1':>9} {'cp GB/s 4':>9} {'Q p50 1':>9} {'Q GB/s 4':>8} {'x 2copy':>8} "
        f"{'cp x 2copy':>10} {'x Q':>6}"
    )
    for size, row in summary["by_size"].items():
        print(
            f"{size:>6} {row['two_copies_us']:>8.1f}u {row['appliance_1_p50_us']:>7.1f}u "
            f"{row['appliance_1_p99_us']:>7.1f}u {row['appliance_1_gbps']:>7.2f} "
            f"{row['appliance_4_gbps']:>7.2f} {row['copying_1_p50_us']:>8.1f}u "
            f"{row['copying_4_gbps']:>9.2f} {row['queue_1_p50_us']:>8.1f}u "
            f"{row['queue_4_gbps']:>8.2f} {row['ratio_vs_two_copies']:>8.2f} "
            f"{row['copying_ratio_vs_two_copies']:>10.2f} {row['speedup_vs_queue_1']:>6.1f}"
        )
    print("\ntargets (this 2-vCPU machine kind):")
    for key, target in TARGETS.items():
        value = summary["checks"][key]
        better_low = not key.startswith("speedup")
        met = value <= target if better_low else value >= target
        sign = "<=" if better_low else ">="
        print(f"  {key}: {value:.2f} (target {sign} {target}) {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
