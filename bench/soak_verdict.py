"""The soak's verdict: the first and last windows of its samples compared, and its table.

Apart from soak.py because judging needs the samples alone, not the
appliance: what grew by more than the allowed growth, and which processes
were restarted.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterator
from typing import Any

MEDIAN_OF = 3


def series(samples: list[dict[str, Any]]) -> Iterator[tuple[str, str, str]]:
    """Every measured quantity: (name, process or "", what)."""
    yield "shm bytes", "", "shm_bytes"
    for name in samples[0]["processes"]:
        for what in ("rss", "fds"):
            yield f"{name} {what}", name, what


def values(samples: list[dict[str, Any]], process: str, what: str) -> list[float]:
    if not process:
        return [s[what] for s in samples]
    found = [s["processes"].get(process, {}).get(what) for s in samples]
    return [v for v in found if v is not None]


def windows(measured: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and the last quarter of the measured samples (at least MEDIAN_OF each).

    A quarter of the run, not a few samples: a window then spans many
    calls of every protocol, so its least fd count is the process's steady
    state, not a moment between a connection's open and its close.
    """
    size = max(MEDIAN_OF, len(measured) // 4)
    return measured[:size], measured[-size:]


def new_fds(process: str, first: list[dict[str, Any]], last: list[dict[str, Any]]) -> str:
    """What a process holds at the end of the run and did not at its start.

    Compares the sample with the fewest fds of each window, as their
    targets counted: e.g. "2 x unix (unnamed), 1 x anon_inode:[eventfd]".
    """

    def fewest(window: list[dict[str, Any]]) -> collections.Counter[str]:
        held = [s["targets"][process] for s in window if process in s["targets"]]
        return collections.Counter(min(held, key=len)) if held else collections.Counter()

    before, after = fewest(first), fewest(last)
    grown = after - before
    listed = ", ".join(f"{count} x {target}" for target, count in grown.most_common(12))
    closed = sum((before - after).values())
    return f"new: {listed or 'none'}" + (f" ({closed} others closed)" if closed else "")


def judge(measured: list[dict[str, Any]], max_growth: float) -> dict[str, Any]:
    """Compare the start of the measured part with its end; list what grew."""
    if len(measured) < 2 * MEDIAN_OF:
        raise SystemExit(f"only {len(measured)} samples after the warm-up; run longer")
    first, last = windows(measured)
    rows, problems = [], []
    for name, process, what in series(measured):
        early, late = values(first, process, what), values(last, process, what)
        if len(early) < MEDIAN_OF or len(late) < MEDIAN_OF:
            problems.append(f"{name}: the process did not last the whole run")
            continue
        # An fd opened for a moment (the control connection this sampler
        # just used, a /proc read) adds one to a sample; a leak raises the
        # least count as well, so fds compare their minimums.
        pick = min if what == "fds" else statistics.median
        start, end = pick(early), pick(late)
        growth = (end - start) / start if start else 0.0
        rows.append({"what": name, "start": start, "end": end, "growth": round(growth, 4)})
        if growth > max_growth:
            problem = f"{name} grew {growth:.1%}: {start:g} -> {end:g}"
            if what == "fds":
                problem += f"; {new_fds(process, first, last)}"
            problems.append(problem)
    return {"rows": rows, "problems": problems}


def restarts(samples: list[dict[str, Any]]) -> list[str]:
    pids = {
        name: {s["processes"].get(name, {}).get("pid") for s in samples}
        for name in samples[0]["processes"]
    }
    return [
        f"{name} restarted: pids {sorted(p for p in got if p)}"
        for name, got in pids.items()
        if len(got) > 1
    ]


def print_table(rows: list[dict[str, Any]], calls: dict[str, Any]) -> None:
    print(f"\n{'what':32} {'start':>14} {'end':>14} {'growth':>8}")
    for row in rows:
        print(f"{row['what']:32} {row['start']:14,.0f} {row['end']:14,.0f} {row['growth']:8.2%}")
    print(f"\n{'protocol':20} {'calls':>8} {'failed':>7} {'p50 ms':>8} {'max ms':>8}")
    for protocol, row in calls.items():
        print(
            f"{protocol:20} {row['calls']:8d} {row['failed']:7d} "
            f"{row['p50_ms']:8.2f} {row['max_ms']:8.2f}"
        )
