"""Triton Python-backend models: the same ``model.py`` on the appliance and on real Triton,
beside the appliance's own model class.

One run, one machine, one load generator (bench/loadgen.py's client
processes, closed loops, one request in flight each). Three servers of the
same two models:

- ``native``: the appliance's demo classes (``identity``, ``digits``);
- ``python``: the appliance serving bench/peers/python_backend/ (the same
  models written as Triton Python models, ``identity_py`` and ``digits_py``);
- ``triton``: tritonserver 2.51 (bench/triton_peer.py) serving that very
  repository, one instance each, as the appliance.

Cells: KServe gRPC (tritonclient.grpc) and REST (tritonclient.http, binary
tensors), ``identity`` at 16 B and ``digits`` (one image), 1 and 8 clients.
Rounds interleave the servers; the table holds medians over rounds. Server
CPU per request is each server's whole process tree (psutil).

Targets (the Python-backend issue): a Python-backend model costs the
appliance at most 1.1x its native class per request (server CPU, python /
native); beside it, python / triton for the same ``model.py``. Results go to
bench/results/python_backend.json. Usage::

    python bench/bench_python_backend.py [--seconds S] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers  # noqa: E402
from bench.loadgen import (  # noqa: E402
    ClientPool,
    ProcessTree,
    appliance_serving,
    median_row,
    round_arguments,
    write_results,
)
from bench.servers import PeerUnavailable  # noqa: E402
from bench.triton_peer import VERSION, bench_repository, tritonserver  # noqa: E402
from tests.system.harness import make_config, new_run_dir  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "python_backend.json"
# server -> model -> the name it is served as
SERVED = {
    "native": {"identity": "identity", "digits": "digits"},
    "python": {"identity": "identity_py", "digits": "digits_py"},
    "triton": {"identity": "identity_py", "digits": "digits_py"},
}
PAYLOADS = {"identity 16B": {"model": "identity", "nbytes": 16}, "digits": {"model": "digits"}}
PROTOCOLS = {"grpc": "kserve-grpc", "rest": "kserve-rest"}
CLIENTS = (1, 8)
TARGET = 1.1


def appliance(models: Path) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """The appliance with the native classes and the Python-backend repository."""
    native = [
        {"name": "identity", "class": "appliance.demos.identity:Identity"},
        {"name": "digits", "class": "appliance.demos.digits:Digits"},
    ]
    config = make_config(new_run_dir(), native)
    config["repositories"] = [{"path": str(models)}]
    return appliance_serving(config)


def main() -> int:
    args = round_arguments(__doc__.split("\n")[0], 0.5)
    with contextlib.ExitStack() as stack:
        models = stack.enter_context(bench_repository())
        ours = stack.enter_context(appliance(models))
        servers = {"native": ours, "python": ours}
        try:
            triton = stack.enter_context(tritonserver(models))
            servers["triton"] = {"urls": triton.urls, "pid": triton.process.pid}
        except PeerUnavailable as ex:
            print(f"Triton left out: {ex}", file=sys.stderr)
        pool = stack.enter_context(
            ClientPool(max(CLIENTS), callers.make_call, preload=callers.PRELOAD)
        )
        runs = measure(pool, servers, args)
    summary = summarise(runs)
    report(summary)
    write_results(
        RESULTS,
        seconds=args.seconds,
        rounds=args.rounds,
        triton=VERSION if "triton" in servers else None,
        summary=summary,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


Runs = dict[str, dict[str, list[dict[str, Any]]]]


def measure(pool: ClientPool, servers: dict[str, dict[str, Any]], args: argparse.Namespace) -> Runs:
    """Every cell on every server; rounds outermost, servers innermost (interleaved)."""
    runs: Runs = {}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr)
        for payload, spec in PAYLOADS.items():
            for protocol, caller in PROTOCOLS.items():
                for clients in CLIENTS:
                    cell = f"{protocol} {payload} {clients}c"
                    for server, where in servers.items():
                        url = where["urls"]["http" if protocol == "rest" else "grpc"]
                        target = {
                            **spec,
                            "protocol": caller,
                            "url": url,
                            "served_as": SERVED[server][spec["model"]],
                        }
                        tree = ProcessTree(where["pid"])
                        row = pool.measure(target, clients, args.seconds, tree)
                        if row["errors"]:
                            raise RuntimeError(f"{server} {cell}: {row['error']}")
                        runs.setdefault(cell, {}).setdefault(server, []).append(row)
    return runs


def summarise(runs: Runs) -> dict[str, Any]:
    table = {
        cell: {server: median_row(rows) for server, rows in by_server.items()}
        for cell, by_server in runs.items()
    }
    ratios: dict[str, dict[str, float]] = {}
    for cell, rows in table.items():
        pairs = [("python/native", "python", "native"), ("python/triton", "python", "triton")]
        for name, a, b in pairs:
            if a in rows and b in rows:
                ratios.setdefault(cell, {})[name] = (
                    rows[a]["server_cpu_us"] / rows[b]["server_cpu_us"]
                )
    worst = max((r["python/native"] for r in ratios.values()), default=float("nan"))
    return {
        "by_cell": table,
        "cpu_ratios": ratios,
        "python_over_native_worst": worst,
        "python_over_native_median": statistics.median(r["python/native"] for r in ratios.values()),
        "target_met": worst <= TARGET,
    }


def report(summary: dict[str, Any]) -> None:
    print("\nmedians over rounds; server CPU per request is the server's whole process tree")
    print("| cell | server | p50 ms | req/s | server CPU µs/req |")
    print("|---|---|---|---|---|")
    for cell, rows in summary["by_cell"].items():
        for server, row in rows.items():
            print(
                f"| {cell} | {server} | {row['p50_ms']:.3f} | {row['rps']:.0f} | "
                f"{row['server_cpu_us']:.0f} |"
            )
    print("\n| cell | CPU python/native | CPU python/triton |")
    print("|---|---|---|")
    for cell, ratio in summary["cpu_ratios"].items():
        triton = ratio.get("python/triton")
        shown = f"{triton:.2f}x" if triton is not None else "-"
        print(f"| {cell} | {ratio['python/native']:.2f}x | {shown} |")
    worst = summary["python_over_native_worst"]
    verdict = "met" if summary["target_met"] else "MISSED"
    print(
        f"\nPython-backend model / native class, server CPU per request: worst {worst:.2f}x "
        f"(target <= {TARGET}x): {verdict}"
    )


if __name__ == "__main__":
    sys.exit(main())
