"""A guard against creep: CPU per request thread by thread, a base revision against the tree.

A feature that adds a little to every request (a check, a counter, a log
call) shows in no single benchmark; over a few weeks it adds up. This runs
bench/ab.py's machinery over issue 55's identity cells (KServe REST JSON and
gRPC, 16 B, 1 and 8 clients): A is the appliance package at a base revision
(``--base``; by default the newest tag reachable from HEAD, or ``HEAD~20``
where there is none), B the working tree, the order alternating between
rounds, with the hop's floor (bench/bench_hop_floor.py, ZeroMQ alone) in the
same rounds to tell the code's creep from the machine's drift. Where the
tree's request path runs compiled (appliance/native.py), the base's is
compiled too before the run, so both sides run the same way. It prints, per
cell, each thread kind's and each process's CPU per request on both sides
and B/A (bench/threads.py), and writes bench/results/creep.json and
creep.md. ``--record`` appends B's REST JSON figures as a dated row to the
table "Per request, thread by thread" in docs/performance.md (between its
``<!-- creep:begin -->`` and ``<!-- creep:end -->`` markers). Usage::

    python bench/bench_creep.py [--base REV] [--seconds S] [--rounds R] [--quick]
                                [--no-floors] [--record]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ab import Grid, Side, compare, exported, grid_of, with_settings  # noqa: E402
from bench.plan import FULL_SWEEP, THREAD_CLIENTS, THREAD_SYSTEMS  # noqa: E402
from bench.thread_tables import medians  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "creep.json"
PAGE = ROOT / "docs" / "performance.md"
TAG = "creep"
# The page's columns: (header, the thread kinds summed there); "the rest" is every other kind.
COLUMNS = (
    ("frontend main", ("frontend main",)),
    ("frontend ZeroMQ I/O", ("frontend zmq io",)),
    ("model worker main", ("worker main",)),
    ("model worker ZeroMQ I/O", ("worker zmq io",)),
)
RECORDED = "kserve-rest-json"
PLACEHOLDER = "to be measured"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="the revision to compare with (newest tag, or HEAD~20)")
    parser.add_argument("--seconds", type=float, default=2.0, help="per cell")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 0.5 s cells, 1 round")
    parser.add_argument("--no-floors", action="store_true", help="without the hop's floor")
    parser.add_argument("--record", action="store_true", help=f"add a row to {PAGE.name}")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 0.5, 1
    base = args.base or default_base()
    cells = grid_of(FULL_SWEEP, set(THREAD_SYSTEMS), {"16B"}, set(THREAD_CLIENTS))
    with contextlib.ExitStack() as exports:
        base_dir = exported(base, exports)
        mode = built_alike(base, base_dir)
        tree_env = {} if mode == "compiled" else {"APPLIANCE_PURE": "1"}
        sides = (
            Side(f"@{base}", with_settings([]), base_dir),
            Side("working tree", with_settings([]), ROOT, tree_env),
        )
        extra = {"base": base, "revision": revision(), "mode": mode, "args": vars(args)}
        grid = Grid(cells, args.seconds, args.rounds)
        print(compare(sides, grid, RESULTS.stem, extra, floors=not args.no_floors))
    if args.record:
        row = page_row(json.loads(RESULTS.read_text()))
        if record(PAGE, row):
            print(f"added a row to the {TAG} table in {PAGE.relative_to(ROOT)}")
    return 0


def built_alike(base: str, base_dir: Path) -> str:
    """Return "compiled" where the tree's request path runs compiled and the base's
    (exported: pure Python) compiled too, else "pure": the tree then runs pure as
    well, so both sides run the same way."""
    if state_of(ROOT) != "compiled (mypyc)" or not (base_dir / "appliance/native.py").exists():
        print("both sides run pure Python (the tree's request path or the base's is not compiled)")
        return "pure"
    # Built as in a checkout of the base (its mypy settings), in the export, whose
    # package is the one imported there.
    (base_dir / "pyproject.toml").write_text(git("show", f"{base}:pyproject.toml") + "\n")
    build = "from appliance import native; raise SystemExit(native.build())"
    subprocess.run([sys.executable, "-c", build], cwd=base_dir, check=True)
    return "compiled" if state_of(base_dir) == "compiled (mypyc)" else "pure"


def state_of(where: Path) -> str:
    """How the request path of the appliance package under ``where`` runs (native.state)."""
    return subprocess.run(
        [sys.executable, "-c", "from appliance import native; print(native.state())"],
        cwd=where,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def git(*argv: str) -> str:
    done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def default_base() -> str:
    """The newest tag reachable from HEAD, else HEAD~20."""
    tag = git("describe", "--tags", "--abbrev=0")
    if tag:
        return tag
    if not git("rev-parse", "--verify", "--quiet", "HEAD~20"):
        raise SystemExit("no tag and no HEAD~20: name a base with --base")
    return "HEAD~20"


def revision() -> str:
    """The working tree's revision: HEAD's short hash, "+" when appliance/ has changes."""
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+" if git("status", "--porcelain", "--", "appliance") else "")


def page_row(record: dict[str, Any]) -> str:
    """B's REST JSON medians as a row of the page's table: date, revision, then per
    column "1 client / 8 clients" µs per request."""
    label = record["sides"][1]
    by_clients: dict[int, dict[str, Any] | None] = {}
    for clients in THREAD_CLIENTS:
        rows = [
            r
            for r in record["rows"]
            if r["variant"] == label
            and r["system"] == RECORDED
            and r["payload"] == "16B"
            and r["concurrency"] == clients
        ]
        by_clients[clients] = medians(rows)
    named = {kind for _header, kinds in COLUMNS for kind in kinds}

    def figure(row: dict[str, Any] | None, kinds: tuple[str, ...] | None) -> str:
        if row is None:
            return "n/a"
        spent = row.get("threads_us") or {}
        if kinds is None:  # the rest: every kind no column names
            return f"{sum(v for k, v in spent.items() if k not in named):,.0f}"
        return f"{sum(spent.get(k, 0.0) for k in kinds):,.0f}"

    cells = [
        " / ".join(figure(by_clients[c], kinds) for c in THREAD_CLIENTS)
        for kinds in (*(k for _h, k in COLUMNS), None)
    ]
    whole = " / ".join(
        f"{row['server_cpu_us']:,.0f}" if row else "n/a" for row in by_clients.values()
    )
    rounds = int(record["args"]["rounds"])
    counted = f"{rounds} round{'s' * (rounds != 1)}, {record.get('mode', 'pure')}"
    when = datetime.date.today().isoformat()
    return f"| {when} | {record['revision']} ({counted}) | " + " | ".join([*cells, whole]) + " |"


def record(page: Path, row: str) -> bool:
    """Append ``row`` to the table between the page's creep markers (the placeholder
    row goes once a real one is there); False, and a warning, without the markers."""
    begin, end = f"<!-- {TAG}:begin -->", f"<!-- {TAG}:end -->"
    text = page.read_text()
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        print(f"{page.name} has no {begin} ... {end} markers: row not written")
        return False
    table = text[start + len(begin) : stop].strip("\n").splitlines()
    table = [line for line in table if PLACEHOLDER not in line]
    body = "\n".join([*table, row])
    page.write_text(text[: start + len(begin)] + "\n" + body + "\n" + text[stop:])
    return True


if __name__ == "__main__":
    sys.exit(main())
