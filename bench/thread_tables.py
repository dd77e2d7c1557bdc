"""Markdown tables of CPU per request by thread kind and by process, side by side.

Each column is one server's (median) row with ``threads_us``,
``processes_us`` and ``server_cpu_us`` (bench/loadgen.py's measure, or the
hop floor's row, bench/bench_hop_floor.py); each table row is a thread kind,
then a process role, then the whole server. The same tables of
``threads_runs`` and ``processes_runs`` (``field="runs"``) say how many times
each ran per request: its wake-ups (bench/threads.py). ab.py, bench_creep.py and
bench_peers.py's tables (bench/doc_tables.py) are all drawn here, so the
three read the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench import threads
from bench.loadgen import median_row
from bench.plan import THREAD_CLIENTS
from bench.report import Summary, cell

# (header, row or None): a column of a table.
Column = tuple[str, Mapping[str, Any] | None]
# (header, numerator column, denominator column): a ratio column.
Ratio = tuple[str, int, int]
WHOLE = "whole server (process tree)"
# Below this in every column a line is left out: idle processes' timers.
SHOWN_US = 0.5
# Below this a ratio's denominator is noise (a few wake-ups of an idle thread): no ratio.
RATIO_FLOOR_US = 2.0
# Triton's counterparts of the appliance's lines: its Python stub runs the model.
TRITON_ALIAS = {"model worker (process)": "python stub (process)"}


@dataclass(frozen=True)
class Measure:
    """What a table shows: a row's fields, its heading, and how finely."""

    field: str
    heading: str
    digits: int
    shown: float  # below this in every column a line is left out
    ratio_floor: float  # below this a ratio's denominator is noise


CPU = Measure("us", "CPU µs per request", 0, SHOWN_US, RATIO_FLOOR_US)
RUNS = Measure("runs", "Runs (wake-ups) per request", 2, 0.05, 0.1)


def lines_of(row: Mapping[str, Any] | None, field: str = "us") -> dict[str, float]:
    """A row's figures by table line: its kinds, its processes, the whole tree
    (``field``: "us" for CPU, "runs" for the times the threads ran)."""
    if row is None:
        return {}
    out = {kind: float(v) for kind, v in (row.get(f"threads_{field}") or {}).items()}
    processes = row.get(f"processes_{field}") or {}
    out |= {f"{role} (process)": float(v) for role, v in processes.items()}
    if field == "us":
        whole = row.get("server_cpu_us")
    else:
        # The whole tree's runs are its processes' (none where the row counted none).
        whole = sum(processes.values(), 0.0) if processes else None
    if isinstance(whole, int | float) and not math.isnan(whole):
        out[WHOLE] = float(whole)
    return out


def table(
    columns: Sequence[Column],
    ratios: Sequence[Ratio] = (),
    aliases: Mapping[int, Mapping[str, str]] | None = None,
    measure: Measure = CPU,
) -> list[str]:
    """One markdown table: a line per thread kind, per process role, and the whole server.

    ``aliases`` maps a column's index to {line: the line of that column shown
    there instead}, e.g. Triton's stub on the model worker's line, so a ratio
    column compares the two.
    """
    aliases = aliases or {}
    figures = [lines_of(row, measure.field) for _header, row in columns]
    kinds = threads.ordered({k for f in figures for k in f if not k.endswith(")")})
    # A role whose threads are all of one kind of its name (Triton's, the master) has
    # its line among the kinds already.
    roles = threads.ordered(
        {
            k.removesuffix(" (process)")
            for f in figures
            for k in f
            if k.endswith(" (process)") and k.removesuffix(" (process)") not in threads.KINDS
        }
    )
    order = [*kinds, *(f"{role} (process)" for role in roles), WHOLE]

    def value(index: int, line: str) -> float | None:
        shown = aliases.get(index, {}).get(line, line)
        return figures[index].get(shown)

    heads = [header for header, _row in columns] + [header for header, _a, _b in ratios]
    out = [
        f"| {measure.heading} | " + " | ".join(heads) + " |",
        "|---" * (len(heads) + 1) + "|",
    ]
    for line in order:
        values = [value(i, line) for i in range(len(columns))]
        if line != WHOLE and all(v is None or v < measure.shown for v in values):
            continue
        cells = []
        for index, v in enumerate(values):
            text = "" if v is None else f"{v:,.{measure.digits}f}"
            shown = aliases.get(index, {}).get(line)
            if v is not None and shown:
                text += f" ({shown.removesuffix(' (process)')})"
            cells.append(text)
        for _header, top, bottom in ratios:
            a, b = values[top], values[bottom]
            if a is None or b is None or b < measure.ratio_floor:
                cells.append("")
            else:
                cells.append(f"{a / b:.2f}")
        label = f"**{line}**" if line == WHOLE else line
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def medians(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The median row of repeats (each kind's own median), None for none."""
    return median_row([dict(r) for r in rows]) if rows else None


def busiest_frontend(row: Mapping[str, Any] | None) -> str:
    """The frontend role that served a row's requests (the one that spent most)."""
    spent = (row or {}).get("processes_us") or {}
    return max(threads.FRONTENDS, key=lambda role: float(spent.get(role, 0.0)))


def as_frontend(row: Mapping[str, Any] | None, role: str) -> dict[str, Any] | None:
    """The hop floor's row with its client process on ``role``'s line: the client
    stands where that frontend stands in the appliance."""
    if row is None:
        return None
    out = dict(row)
    for field in ("processes_us", "processes_runs"):
        spent = dict(row.get(field) or {})
        if "hop client" in spent:
            spent[role] = spent.pop("hop client")
        out[field] = spent
    return out


def cell_table(
    ours: Sequence[Column],
    triton: Mapping[str, Any] | None = None,
    floors: Sequence[Column] = (),
    hop: Mapping[str, Any] | None = None,
    hop_header: str = "hop floor",
    measure: Measure = CPU,
) -> list[str]:
    """One cell's table: the appliance's columns (two: with their ratio), Triton's (with
    each of ours over it), the floors', and the hop floor's (its client on the line of
    the frontend that served the cell)."""
    columns = list(ours)
    ratios: list[Ratio] = []
    if len(ours) == 2:
        ratios.append((f"{ours[1][0]} / {ours[0][0]}", 1, 0))
    aliases: dict[int, Mapping[str, str]] = {}
    if triton is not None:
        aliases[len(columns)] = TRITON_ALIAS
        ratios += [(f"{header} / Triton", i, len(columns)) for i, (header, _r) in enumerate(ours)]
        columns.append(("Triton", triton))
    columns += [(header, row) for header, row in floors if row is not None]
    if hop is not None:
        columns.append((hop_header, as_frontend(hop, busiest_frontend(ours[0][1]))))
    return table(columns, ratios, aliases, measure)


def cell_tables(
    ours: Sequence[Column],
    triton: Mapping[str, Any] | None = None,
    floors: Sequence[Column] = (),
    hop: Mapping[str, Any] | None = None,
    hop_header: str = "hop floor",
) -> list[str]:
    """:func:`cell_table` of CPU, then of runs where the rows counted them."""
    out = cell_table(ours, triton, floors, hop, hop_header)
    rows = [row for _header, row in (*ours, *floors)] + [triton, hop]
    if any(row is not None and row.get("threads_runs") for row in rows):
        out += ["", *cell_table(ours, triton, floors, hop, hop_header, RUNS)]
    return out


# bench_peers' per-thread cells: the appliance system, Triton's, and the floors beside
# it as (header, system): each frontend's floor, and for REST the ladder's rungs.
PEER_CELLS = (
    (
        "kserve-rest-json",
        "triton rest-json",
        (
            ("floor (uvicorn's worker)", "floor-uvicorn"),
            ("ladder: floor rung", "ladder-floor kserve-rest-json"),
            ("ladder: codec rung", "ladder-codec kserve-rest-json"),
            ("ladder: floor + ZeroMQ hop", "ladder-hop kserve-rest-json"),
        ),
    ),
    (
        "kserve-grpc",
        "triton grpc",
        (
            ("grpc.aio floor", "floor-grpc-aio"),
            ("grpc.aio + the appliance's codec", "floor-grpc-aio-codec"),
            ("grpc.aio + ZeroMQ hop floor", "floor-grpc-aio-hop"),
        ),
    ),
)


def peers_tables(summary: Summary, hops: Sequence[Mapping[str, Any]]) -> list[str]:
    """bench_peers' identity 16 B cells of issue 55, thread by thread, beside Triton,
    the floors and the hop's floor (``hops``: its median rows by ``inflight``)."""
    out: list[str] = []
    for system, triton, floors in PEER_CELLS:
        for clients in THREAD_CLIENTS:
            ours = cell(summary, system, "16B", clients)
            if ours is None or "threads_us" not in ours:
                continue
            hop = next((h for h in hops if h.get("inflight") == clients), None)
            beside = [(header, cell(summary, name, "16B", clients)) for header, name in floors]
            out += ["", f"{system}, 16 B, {clients} client(s):", ""]
            out += cell_tables(
                [("appliance", ours)],
                cell(summary, triton, "16B", clients),
                beside,
                hop,
                f"hop floor (zmq, {clients} in flight)",
            )
    return out
