"""The response cache: a repeated request answered from the cache, on the appliance and on Triton.

One run, one machine, one load generator (bench/loadgen.py). Both servers
serve bench/peers/python_backend/ (``identity_py``, ``digits_py``) and a
copy of each with ``response_cache { enable: true }`` (``*_cached``); the
appliance with ``server.response_cache_bytes``, tritonserver 2.51 with
``--cache-config local,size=...``, 64 MiB each. Every client sends the same
request over and over, so after the first each one is a hit.

Cells: KServe gRPC and REST (binary tensors), ``identity`` at 16 B and
``digits`` (one image), 1 and 8 clients, with and without the cache.
Rounds interleave the servers; the table holds medians over rounds; server
CPU per request is each server's whole process tree (psutil). Results go to
bench/results/response_cache.json. Usage::

    python bench/bench_response_cache.py [--seconds S] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
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

RESULTS = ROOT / "bench" / "results" / "response_cache.json"
CACHE_BYTES = 64 << 20
PAYLOADS = {"identity 16B": {"model": "identity", "nbytes": 16}, "digits": {"model": "digits"}}
PROTOCOLS = {"grpc": "kserve-grpc", "rest": "kserve-rest"}
CLIENTS = (1, 8)
CACHED = {False: "{model}_py", True: "{model}_cached"}


def with_cached_copies(models: Path) -> None:
    """Add ``<model>_cached``: the same model.py, its config with the cache on."""
    for model in ("identity", "digits"):
        source, copy = models / f"{model}_py", models / f"{model}_cached"
        shutil.copytree(source, copy)
        config = (copy / "config.pbtxt").read_text().replace(f"{model}_py", f"{model}_cached")
        (copy / "config.pbtxt").write_text(config + "\nresponse_cache { enable: true }\n")


def appliance(models: Path) -> contextlib.AbstractContextManager[dict[str, Any]]:
    config = make_config(new_run_dir(), [])
    config["server"]["response_cache_bytes"] = CACHE_BYTES
    config["repositories"] = [{"path": str(models)}]
    return appliance_serving(config)


def main() -> int:
    args = round_arguments(__doc__.split("\n")[0], 0.5)
    with contextlib.ExitStack() as stack:
        models = stack.enter_context(bench_repository())
        with_cached_copies(models)
        servers = {"appliance": stack.enter_context(appliance(models))}
        try:
            options = [f"--cache-config=local,size={CACHE_BYTES}"]
            triton = stack.enter_context(tritonserver(models, options))
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
        cache_bytes=CACHE_BYTES,
        summary=summary,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


Runs = dict[str, dict[str, list[dict[str, Any]]]]


def measure(pool: ClientPool, servers: dict[str, dict[str, Any]], args: argparse.Namespace) -> Runs:
    """Every cell on every server, cached and not; rounds outermost, servers innermost."""
    runs: Runs = {}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr)
        for payload, spec in PAYLOADS.items():
            for protocol, caller in PROTOCOLS.items():
                for clients in CLIENTS:
                    cell = f"{protocol} {payload} {clients}c"
                    for cached, name in CACHED.items():
                        for server, where in servers.items():
                            url = where["urls"]["http" if protocol == "rest" else "grpc"]
                            served_as = name.format(model=spec["model"])
                            target = {
                                **spec,
                                "protocol": caller,
                                "url": url,
                                "served_as": served_as,
                            }
                            row = pool.measure(
                                target, clients, args.seconds, ProcessTree(where["pid"])
                            )
                            if row["errors"]:
                                raise RuntimeError(f"{server} {cell}: {row['error']}")
                            key = f"{server} {'cached' if cached else 'no cache'}"
                            runs.setdefault(cell, {}).setdefault(key, []).append(row)
    return runs


def summarise(runs: Runs) -> dict[str, Any]:
    table = {
        cell: {key: median_row(rows) for key, rows in by_key.items()}
        for cell, by_key in runs.items()
    }
    ratios: dict[str, dict[str, float]] = {}
    for cell, rows in table.items():
        for server in ("appliance", "triton"):
            hit, miss = rows.get(f"{server} cached"), rows.get(f"{server} no cache")
            if hit and miss:
                ratios.setdefault(cell, {})[f"{server} cached/no cache CPU"] = (
                    hit["server_cpu_us"] / miss["server_cpu_us"]
                )
        ours, theirs = rows.get("appliance cached"), rows.get("triton cached")
        if ours and theirs:
            ratios.setdefault(cell, {})["appliance/triton cached CPU"] = (
                ours["server_cpu_us"] / theirs["server_cpu_us"]
            )
            ratios[cell]["appliance/triton cached p50"] = ours["p50_ms"] / theirs["p50_ms"]
    return {"by_cell": table, "ratios": ratios}


def report(summary: dict[str, Any]) -> None:
    print("\nmedians over rounds; server CPU per request is the server's whole process tree")
    print("| cell | server | p50 ms | req/s | server CPU µs/req |")
    print("|---|---|---|---|---|")
    for cell, rows in summary["by_cell"].items():
        for key, row in rows.items():
            print(
                f"| {cell} | {key} | {row['p50_ms']:.3f} | {row['rps']:.0f} | "
                f"{row['server_cpu_us']:.0f} |"
            )
    print("\n| cell | " + " | ".join(next(iter(summary["ratios"].values()), {})) + " |")
    for cell, ratio in summary["ratios"].items():
        print(f"| {cell} | " + " | ".join(f"{value:.2f}x" for value in ratio.values()) + " |")


if __name__ == "__main__":
    sys.exit(main())
