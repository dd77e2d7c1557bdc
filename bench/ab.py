"""A/B of two appliance configs in one run, over bench_peers' appliance cells.

Both appliances serve bench_peers' models with its sections (bench/plan.py),
each with its own settings on top, side by side; each cell (an appliance
system of ``APPLIANCE`` at a payload and client count of the sweep) runs on
one, then the other, the order alternating between repeats, so drift on the
shared host weighs on both alike. The table gives, per cell, the median over
repeats of each side and the ratios B/A of throughput, p50 and server CPU per
request (CPU of each appliance's whole process tree, psutil), then per cell
the CPU per request by thread kind and by process (bench/threads.py: the
frontend's main thread, its ZeroMQ I/O thread, the model worker's, ...),
each kind's median over repeats. Usage::

    python bench/ab.py --name spin --a server.spin_wait_us=0 \\
        --systems kserve-rest,umbridge,mip --payloads 16B --clients 1,16 --repeats 5

``--a`` and ``--b`` take ``section.key=value`` settings (the value read as
TOML, a bare word as a string), repeated for more; a side with none runs the
defaults. ``--a-rev``/``--b-rev`` serve that side from the appliance package
of a git revision (``git archive`` into a temporary directory, the side run
from there: pure Python), so two commits compare in one run; ``--a-dir``/
``--b-dir`` from a checkout elsewhere (where ``make native`` compiled it, two
compiled builds compare)::

    python bench/ab.py --name hop --a-rev e558e5b --triton \
        --systems kserve-rest-json,kserve-grpc --payloads 16B --clients 1,16 --repeats 4

``--triton`` measures real Triton (bench/triton_peer.py) on each cell too,
its counterpart system in the same rounds, and adds each side's ratios to
it (its tritonserver and Python stubs beside the appliance's threads).
``--floors`` runs the hop's floor (bench/bench_hop_floor.py: ZeroMQ alone,
a client and a worker, in flight = each client count of the grid) in the
same rounds, its threads beside the appliance's. Without
``--systems``/``--payloads``/``--clients`` every appliance cell of the sweep
runs (``--quick``: bench_peers' quick sweep).

Not run by ``make bench``. Results: bench/results/ab-NAME.json and ab-NAME.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers, thread_tables, triton_peer  # noqa: E402
from bench.bench_hop_floor import measure_apart  # noqa: E402
from bench.bench_peers import appliance_endpoints  # noqa: E402
from bench.loadgen import ClientPool, ProcessTree, export_package, write_results  # noqa: E402
from bench.plan import (  # noqa: E402
    APPLIANCE,
    FULL_SWEEP,
    PAYLOADS,
    QUICK_SWEEP,
    SYSTEMS,
    System,
    appliance_models,
    appliance_sections,
    spec_for,
)
from tests.system.harness import running  # noqa: E402

RESULTS = ROOT / "bench" / "results"
Setup = Callable[[], tuple[list[dict[str, Any]], dict[str, Any]]]


@dataclass(frozen=True)
class Side:
    """One appliance of the comparison: its label, what it serves, how, and where it
    runs from (the package it imports)."""

    label: str
    setup: Setup = field(compare=False)
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict, compare=False)


# The Triton system that serves what each appliance system serves (bench/plan.py).
TRITON_OF = {
    "kserve-rest": "triton rest",
    "kserve-rest-json": "triton rest-json",
    "kserve-grpc": "triton grpc",
    "kserve-shm": "triton shm",
    "kserve-shm-rest": "triton shm-rest",
}
TRITON = "triton"
HOP_TRANSPORT = "zmq"


@dataclass
class Grid:
    """The cells to measure: (system, payload, clients), in order."""

    cells: list[tuple[System, str, int]]
    seconds: float
    repeats: int


def with_settings(settings: Sequence[str]) -> Setup:
    """bench_peers' models and sections with ``section.key=value`` settings on top."""
    parsed = [parse_setting(text) for text in settings]

    def setup() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        sections = copy.deepcopy(appliance_sections())
        for section, key, value in parsed:
            sections.setdefault(section, {})[key] = value
        return appliance_models(), sections

    return setup


def parse_setting(text: str) -> tuple[str, str, Any]:
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise SystemExit(f"a setting is section.key=value, not {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def grid_of(
    sweep: dict[str, tuple[int, ...]],
    systems: set[str] | None = None,
    payloads: set[str] | None = None,
    clients: set[int] | None = None,
) -> list[tuple[System, str, int]]:
    """The appliance cells of ``sweep``, narrowed to the names given."""
    cells = []
    for payload in PAYLOADS:
        if payloads and payload not in payloads:
            continue
        for system in APPLIANCE:
            if systems and system.name not in systems:
                continue
            for level in system.levels(payload, sweep):
                if not clients or level in clients:
                    cells.append((system, payload, level))
    return cells


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def exported(revision: str, stack: contextlib.ExitStack) -> Path:
    """A directory holding the appliance package at ``revision``, removed with ``stack``."""
    where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ab-rev-")))
    export_package(revision, where)
    return where


def compare(
    sides: tuple[Side, Side],
    grid: Grid,
    name: str,
    extra: dict[str, Any],
    triton: bool = False,
    floors: bool = False,
) -> str:
    """Measure every cell on both sides (and Triton's counterpart with ``triton``, the
    hop's floor at each client count with ``floors``); write the results; return the
    tables."""
    rows: list[dict[str, Any]] = []
    hops: list[dict[str, Any]] = []
    record: dict[str, Any] = {
        **extra,
        "sides": [side.label for side in sides],
        "rows": rows,
        "hop_floor": hops,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "cut_short": False,
    }
    signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    pool_size = max(level for _system, _payload, level in grid.cells)
    try:
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(
                ClientPool(
                    pool_size, callers.make_call, preload=callers.PRELOAD, method="forkserver"
                )
            )
            where: dict[str, Any] = {}
            trees: dict[str, ProcessTree] = {}
            for side in sides:
                models, sections = side.setup()
                appliance = stack.enter_context(
                    running(models, env=side.env, cwd=side.cwd, **sections)
                )
                where[side.label] = appliance_endpoints(appliance)
                trees[side.label] = ProcessTree(appliance.process.pid)
                log(f"{side.label} up")
            if triton:
                peer = stack.enter_context(triton_peer.bench_models())
                where[TRITON], trees[TRITON] = peer.urls, peer.tree
                log("triton up")
            for repeat in range(grid.repeats):
                order = sides if repeat % 2 == 0 else sides[::-1]
                if floors:
                    hops += hop_floor(grid, repeat)
                for system, payload, clients in grid.cells:
                    runs = [(side.label, system, "appliance") for side in order]
                    if triton and system.name in TRITON_OF:
                        runs.append((TRITON, SYSTEMS[TRITON_OF[system.name]], TRITON))
                    for label, served, server in runs:
                        spec = spec_for(served, payload, {server: where[label]})
                        row = pool.measure(spec, clients, grid.seconds, trees[label])
                        if row["errors"]:
                            log(f"{label} {served.name} {payload}: {row['error']}")
                        rows.append(
                            {"variant": label, "system": system.name}
                            | {"payload": payload, "repeat": repeat}
                            | row
                        )
                    pool.release()
                log(f"repeat {repeat + 1}/{grid.repeats} done")
    except KeyboardInterrupt:
        record["cut_short"] = True
        log("stopped: writing what was measured so far")
    record["elapsed_s"] = time.monotonic() - began
    record["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    labels = (sides[0].label, sides[1].label)
    record["table"] = table(rows, labels)
    if triton:
        record["table"] += "\n" + beside_triton(rows, labels)
    record["table"] += "\n" + by_thread(rows, hops, labels)
    write_results(RESULTS / f"{name}.json", **record)
    (RESULTS / f"{name}.md").write_text(record["table"])
    return str(record["table"])


def hop_floor(grid: Grid, repeat: int) -> list[dict[str, Any]]:
    """The hop's floor at each client count of the grid, as in flight (a cell that
    fails is logged and left out: the appliance's cells go on)."""
    rows = []
    for inflight in sorted({level for _system, _payload, level in grid.cells}):
        try:
            rows.append(measure_apart(HOP_TRANSPORT, inflight, grid.seconds) | {"repeat": repeat})
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            log(f"hop floor, {inflight} in flight: {error}")
    return rows


def table(rows: list[dict[str, Any]], labels: tuple[str, str]) -> str:
    """Per cell: the medians of each side, their ranges, and the B/A ratios."""
    a_label, b_label = labels
    cells: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        key = (row["system"], row["payload"], row["concurrency"])
        cells.setdefault(key, {}).setdefault(row["variant"], []).append(row)
    lines = [
        f"A: {a_label}; B: {b_label}. Medians over repeats (range).",
        "",
        "| system | payload | clients | req/s A | req/s B | B/A | p50 ms A | p50 ms B | B/A "
        "| server µs/req A | server µs/req B | B/A |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {"rps": [], "p50_ms": [], "server_cpu_us": []}
    for (system, payload, clients), by_side in cells.items():
        if not set(labels) <= set(by_side):
            continue
        figures = []
        for key in ratios:
            a = [r[key] for r in by_side[a_label]]
            b = [r[key] for r in by_side[b_label]]
            ma, mb = statistics.median(a), statistics.median(b)
            ratio = mb / ma if ma else float("nan")
            ratios[key].append(ratio)
            digits = 2 if key == "p50_ms" else 0
            figures.append(f"{_spread(a, digits)} | {_spread(b, digits)} | {ratio:.2f}")
        lines.append(f"| {system} | {payload} | {clients} | " + " | ".join(figures) + " |")
    if ratios["rps"]:
        medians = " | ".join(
            f"| | **{statistics.median(values):.2f}**" for values in ratios.values()
        )
        lines.append(f"| **median of {len(ratios['rps'])} cells** | | | {medians} |")
    return "\n".join(lines) + "\n"


def beside_triton(rows: list[dict[str, Any]], labels: tuple[str, str]) -> str:
    """Per cell: Triton's medians, and each side's median over Triton's."""
    cells: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        key = (row["system"], row["payload"], row["concurrency"])
        cells.setdefault(key, {}).setdefault(row["variant"], []).append(row)
    lines = [
        "Beside Triton in the same rounds: Triton's medians, and A and B over Triton's.",
        "",
        "| system | payload | clients | Triton req/s | A/T | B/T | Triton p50 ms | A/T | B/T "
        "| Triton server µs/req | A/T | B/T |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (system, payload, clients), by_side in cells.items():
        if TRITON not in by_side or not set(labels) <= set(by_side):
            continue
        figures = []
        for key, digits in (("rps", 0), ("p50_ms", 2), ("server_cpu_us", 0)):
            theirs = statistics.median(r[key] for r in by_side[TRITON])
            ours = [statistics.median(r[key] for r in by_side[label]) for label in labels]
            shown = " | ".join(f"{v / theirs:.2f}" if theirs else "n/a" for v in ours)
            figures.append(f"{theirs:,.{digits}f} | {shown}")
        lines.append(f"| {system} | {payload} | {clients} | " + " | ".join(figures) + " |")
    return "\n".join(lines) + "\n"


def by_thread(
    rows: list[dict[str, Any]], hops: list[dict[str, Any]], labels: tuple[str, str]
) -> str:
    """Per cell: each kind's median over repeats, A, B, (Triton, the hop's floor), ratios."""
    cells: dict[tuple[str, str, int], dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        key = (row["system"], row["payload"], row["concurrency"])
        cells.setdefault(key, {}).setdefault(row["variant"], []).append(row)
    out = [
        "CPU µs per request by thread kind and by process (bench/threads.py), each line's "
        "median over repeats; the model worker's process line has Triton's Python stub "
        "beside it. Then the times each ran per request: its wake-ups.",
    ]
    for (system, payload, clients), by_side in cells.items():
        if not set(labels) <= set(by_side):
            continue
        ours: list[thread_tables.Column] = [
            ("A", thread_tables.medians(by_side[labels[0]])),
            ("B", thread_tables.medians(by_side[labels[1]])),
        ]
        hop = [h for h in hops if h["concurrency"] == clients]
        out += ["", f"{system}, {payload}, {clients} client(s):", ""]
        out += thread_tables.cell_tables(
            ours,
            thread_tables.medians(by_side.get(TRITON, [])),
            hop=thread_tables.medians(hop),
            hop_header=f"hop floor ({HOP_TRANSPORT}, {clients} in flight)",
        )
    return "\n".join(out) + "\n"


def _spread(values: list[float], digits: int) -> str:
    median = statistics.median(values)
    if len(values) < 2:
        return f"{median:,.{digits}f}"
    return f"{median:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="results go to bench/results/ab-NAME.*")
    parser.add_argument("--a", action="append", default=[], help="A's section.key=value")
    parser.add_argument("--b", action="append", default=[], help="B's section.key=value")
    parser.add_argument("--a-rev", help="serve A from the appliance package of this revision")
    parser.add_argument("--b-rev", help="serve B from the appliance package of this revision")
    parser.add_argument("--a-dir", help="serve A from the appliance package under this directory")
    parser.add_argument("--b-dir", help="serve B from the appliance package under this directory")
    parser.add_argument("--a-env", action="append", default=[], help="A's KEY=VALUE environment")
    parser.add_argument("--b-env", action="append", default=[], help="B's KEY=VALUE environment")
    parser.add_argument("--triton", action="store_true", help="measure real Triton beside")
    parser.add_argument(
        "--floors", action="store_true", help="the hop's floor (ZeroMQ alone) in the same rounds"
    )
    parser.add_argument("--quick", action="store_true", help="bench_peers' quick sweep")
    parser.add_argument("--systems", help="comma-separated bench/plan.py appliance systems")
    parser.add_argument("--payloads", help="comma-separated payloads (16B, 1MiB, ...)")
    parser.add_argument("--clients", help="comma-separated client counts")
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the grid")
    args = parser.parse_args()
    cells = grid_of(
        QUICK_SWEEP if args.quick else FULL_SWEEP,
        set(args.systems.split(",")) if args.systems else None,
        set(args.payloads.split(",")) if args.payloads else None,
        {int(c) for c in args.clients.split(",")} if args.clients else None,
    )
    if not cells:
        raise SystemExit("no appliance cell matches --systems/--payloads/--clients")
    with contextlib.ExitStack() as exports:
        sides = tuple(
            Side(
                " ".join(
                    [*([f"@{rev}"] if rev else []), *([where] if where else []), *settings, *env]
                )
                or "defaults",
                with_settings(settings),
                Path(where).resolve() if where else exported(rev, exports) if rev else ROOT,
                dict(item.split("=", 1) for item in env),
            )
            for settings, rev, where, env in (
                (args.a, args.a_rev, args.a_dir, args.a_env),
                (args.b, args.b_rev, args.b_dir, args.b_env),
            )
        )
        if sides[0].label == sides[1].label:
            raise SystemExit("A and B are the same settings and revision")
        grid = Grid(cells, args.seconds, args.repeats)
        pair = (sides[0], sides[1])
        print(compare(pair, grid, f"ab-{args.name}", vars(args), args.triton, args.floors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
