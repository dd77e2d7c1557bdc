"""Every appliance row of bench_peers, before and after issue 39, in one run.

``before``: model workers started with a fresh exec and a 32 MiB response ring
each (a model's own ``response_ring_bytes``, identity's 128 MiB, kept), as the
appliance was; ``after``: the defaults now, workers forked from the zygote and
rings sized to the model. Both appliances serve bench_peers' models with its
sections (bench/plan.py) side by side; each cell of bench_peers' load grid
(every appliance system of ``APPLIANCE`` at every payload and client count
of its sweep) runs on one, then the other, the order alternating between
repeats, so drift on the shared host weighs on both alike. The table gives,
per cell, the median over repeats of each and the ratio after/before of
throughput, p50 and server CPU per request. Usage::

    python bench/bench_model_start.py [--quick] [--seconds S] [--repeats R]

Results: bench/results/model-start.json (model-start-quick.json with --quick)
and bench/results/model-start.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers  # noqa: E402
from bench.loadgen import ClientPool, ProcessTree, write_results  # noqa: E402
from bench.plan import (  # noqa: E402
    APPLIANCE,
    FULL_SWEEP,
    PAYLOADS,
    QUICK_SWEEP,
    appliance_models,
    appliance_sections,
    spec_for,
)
from tests.system.harness import running  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MiB = 1 << 20
VARIANTS = ("before", "after")


def appliance_endpoints(appliance: Any) -> dict[str, Any]:
    """Where bench_peers' callers reach an appliance (as bench_peers.py has it)."""
    ports = appliance.ports
    return {
        "grpc": f"127.0.0.1:{ports['grpc']}",
        "http": f"127.0.0.1:{ports['http']}",
        "mip": {x["model"]: int(x["port"]) for x in appliance.state["mip_listeners"]},
        "run_dir": str(appliance.run_dir),
    }


def variant_setup(variant: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    models, sections = appliance_models(), copy.deepcopy(appliance_sections())
    if variant == "before":
        sections["server"]["model_start"] = "exec"
        for model in models:
            model.setdefault("response_ring_bytes", 32 * MiB)
    return models, sections


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="bench_peers' quick sweep, once")
    parser.add_argument("--seconds", type=float, help="per measurement (1.0; quick 0.5)")
    parser.add_argument("--repeats", type=int, help="repeats of the grid (3; quick 1)")
    args = parser.parse_args()
    seconds = args.seconds or (0.5 if args.quick else 1.0)
    repeats = args.repeats or (1 if args.quick else 3)
    sweep = QUICK_SWEEP if args.quick else FULL_SWEEP
    rows: list[dict[str, Any]] = []
    record: dict[str, Any] = {
        "args": vars(args),
        "rows": rows,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "cut_short": False,
    }
    signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    pool_size = max(c for levels in sweep.values() for c in levels)
    try:
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(
                ClientPool(
                    pool_size, callers.make_call, preload=callers.PRELOAD, method="forkserver"
                )
            )
            where: dict[str, Any] = {}
            trees: dict[str, ProcessTree] = {}
            for variant in VARIANTS:
                models, sections = variant_setup(variant)
                appliance = stack.enter_context(running(models, **sections))
                where[variant] = appliance_endpoints(appliance)
                trees[variant] = ProcessTree(appliance.process.pid)
                forked = appliance.log().count("forked model[")
                log(f"{variant} up: {forked} model workers forked")
            for repeat in range(repeats):
                order = VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]
                for payload in PAYLOADS:
                    for system in APPLIANCE:
                        for clients in system.levels(payload, sweep):
                            for variant in order:
                                spec = spec_for(system, payload, {"appliance": where[variant]})
                                row = pool.measure(spec, clients, seconds, trees[variant])
                                if row["errors"]:
                                    log(f"{variant} {system.name} {payload}: {row['error']}")
                                rows.append(
                                    {"variant": variant, "system": system.name}
                                    | {"payload": payload, "repeat": repeat}
                                    | row
                                )
                            pool.release()
                    log(f"repeat {repeat + 1}/{repeats}: {payload} done")
    except KeyboardInterrupt:
        record["cut_short"] = True
        log("stopped: writing what was measured so far")
    record["elapsed_s"] = time.monotonic() - began
    record["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    name = "model-start-quick" if args.quick else "model-start"
    record["table"] = table(rows)
    write_results(RESULTS / f"{name}.json", **record)
    (RESULTS / f"{name}.md").write_text(record["table"])
    print(record["table"])
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    """Per cell: medians of each variant and the after/before ratios."""
    cells: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        key = (row["system"], row["payload"], row["concurrency"])
        cells.setdefault(key, {}).setdefault(row["variant"], []).append(row)
    lines = [
        "| system | payload | clients | req/s before | req/s after | ratio | p50 ms before "
        "| p50 ms after | ratio | server CPU us/req ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {"rps": [], "p50": [], "cpu": []}
    for (system, payload, clients), by_variant in cells.items():
        if set(by_variant) != set(VARIANTS):
            continue
        med = {
            variant: {
                key: statistics.median(r[key] for r in found)
                for key in ("rps", "p50_ms", "server_cpu_us")
            }
            for variant, found in by_variant.items()
        }
        b, a = med["before"], med["after"]
        rps = a["rps"] / b["rps"] if b["rps"] else float("nan")
        p50 = a["p50_ms"] / b["p50_ms"] if b["p50_ms"] else float("nan")
        cpu = a["server_cpu_us"] / b["server_cpu_us"] if b["server_cpu_us"] else float("nan")
        ratios["rps"].append(rps)
        ratios["p50"].append(p50)
        ratios["cpu"].append(cpu)
        lines.append(
            f"| {system} | {payload} | {clients} | {b['rps']:.0f} | {a['rps']:.0f} | {rps:.2f} "
            f"| {b['p50_ms']:.2f} | {a['p50_ms']:.2f} | {p50:.2f} | {cpu:.2f} |"
        )
    if ratios["rps"]:
        lines.append(
            f"| **median of {len(ratios['rps'])} cells** | | | | | "
            f"**{statistics.median(ratios['rps']):.2f}** | | | "
            f"**{statistics.median(ratios['p50']):.2f}** | "
            f"**{statistics.median(ratios['cpu']):.2f}** |"
        )
    return "\n".join(lines) + "\n"


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
