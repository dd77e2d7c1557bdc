"""bench_peers.py's tables: the console's extras and the manual's performance page.

:func:`render` builds the markdown that :func:`update` puts between the
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` markers in
docs/performance.md (:data:`PAGE`), so a rerun replaces the table and nothing
else; bench_gpu.py and bench_models.py put theirs there the same way, between
markers of their own. The HTTP tables and the rows' labels are in
bench/doc_http.py, the per-thread tables in bench/thread_tables.py.
"""

from __future__ import annotations

import datetime
import itertools
import os
import sys
from pathlib import Path
from typing import Any

from bench import thread_tables
from bench.doc_http import LABELS, OWN_TABLES, fmt, http_tables
from bench.plan import (
    APPLIANCE,
    BATCH_DELAY_MS,
    BATCHING_MODELS,
    CALL_COST_MS,
    NO_PEER,
    PEERS,
    SYSTEMS,
)
from bench.report import Summary, cell, find, ratio, unjudged

# The page the benchmarks write their tables into (mkdocs builds it; its
# image paths are relative to docs/).
PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
# The table sits between <!-- TAG:begin --> and <!-- TAG:end -->: "bench" for
# this machine kind, "bench-<N>core" for a many-core host's run beside it.
TAG = "bench"
# The latency-throughput plot as the page shows it: docs/assets/peers.png is a
# link to bench/results/peers.png, which bench_peers.py draws.
PLOT = "assets/peers.png"
BATCHING_LABELS = {"digits": "digits", "digits-2ms": f"digits + {CALL_COST_MS:g} ms per call"}
# (header, payload, concurrency, key): the page's columns.
COLUMNS = (
    ("16 B c=1 p50 ms", "16B", 1, "p50_ms"),
    ("16 B c=16 req/s", "16B", 16, "rps"),
    ("16 B c=16 p99 ms", "16B", 16, "p99_ms"),
    ("16 B c=16 server µs/req", "16B", 16, "server_cpu_us"),
    ("16 KiB c=16 req/s", "16KiB", 16, "rps"),
    ("1 MiB c=16 req/s", "1MiB", 16, "rps"),
    ("16 MiB c=4 req/s", "16MiB", 4, "rps"),
    ("digits c=64 req/s", "digits", 64, "rps"),
)


def grid_table(summary: Summary) -> list[str]:
    lines = [
        "| system | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for name in SYSTEMS:
        if name not in summary or name in OWN_TABLES:
            continue
        values = []
        for _header, payload, concurrency, key in COLUMNS:
            row = cell(summary, name, payload, concurrency)
            values.append(fmt(row[key] if row else None, key))
        lines.append(f"| {LABELS[name]} | " + " | ".join(values) + " |")
    return lines


def ratio_table(summary: Summary) -> list[str]:
    lines = [
        "| appliance / peer | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for peer in PEERS:
        if peer.name not in summary or peer.versus is None or peer.name in OWN_TABLES:
            continue
        values = []
        for _header, payload, concurrency, key in COLUMNS:
            ours = cell(summary, peer.versus, payload, concurrency)
            theirs = cell(summary, peer.name, payload, concurrency)
            both = ours is not None and theirs is not None
            values.append(fmt(ratio(ours[key], theirs[key]) if both else None, "ratio"))
        label = f"{LABELS[peer.versus].removeprefix('appliance, ')} / {LABELS[peer.name]}"
        lines.append(f"| {label} | " + " | ".join(values) + " |")
    return lines


def event_loop_table(rows: list[dict[str, Any]]) -> list[str]:
    """server.event_loop's A/B: each frontend on uvloop and on asyncio's loop."""
    lines = [
        "| 16 B | clients | uvloop req/s | p50 ms | server µs/req "
        "| asyncio req/s | p50 ms | server µs/req | uvloop / asyncio server µs/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for system, clients in sorted({(r["system"], r["concurrency"]) for r in rows}):
        uv = find(rows, system=system, concurrency=clients, event_loop="uvloop")
        aio = find(rows, system=system, concurrency=clients, event_loop="asyncio")
        cells = [
            fmt(uv and uv["rps"]),
            fmt(uv and uv["p50_ms"], "p50_ms"),
            fmt(uv and uv["server_cpu_us"]),
            fmt(aio and aio["rps"]),
            fmt(aio and aio["p50_ms"], "p50_ms"),
            fmt(aio and aio["server_cpu_us"]),
            fmt(ratio(uv and uv["server_cpu_us"], aio and aio["server_cpu_us"]), "ratio"),
        ]
        lines.append(f"| {LABELS[system]} | {clients} | " + " | ".join(cells) + " |")
    return lines


def batching_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| 64 clients | model | batched req/s | p99 ms | server µs/req | rows/batch "
        "| unbatched req/s | p99 ms | server µs/req | req/s ratio | server µs/req ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    kinds = [k for k in BATCHING_MODELS if any(r["payload"] == k for r in rows)]
    for kind, protocol in itertools.product(kinds, sorted({r["system"] for r in rows})):
        on = find(rows, system=protocol, payload=kind)
        off = find(rows, system=protocol, payload=f"{kind}-unbatched")
        cells = [
            fmt(on and on["rps"]),
            fmt(on and on["p99_ms"], "p99_ms"),
            fmt(on and on["server_cpu_us"]),
            fmt(on and on["rows_per_batch"], "p50_ms"),
            fmt(off and off["rps"]),
            fmt(off and off["p99_ms"], "p99_ms"),
            fmt(off and off["server_cpu_us"]),
            fmt(ratio(on and on["rps"], off and off["rps"]), "ratio"),
            fmt(ratio(off and off["server_cpu_us"], on and on["server_cpu_us"]), "ratio"),
        ]
        lines.append(f"| {protocol} | {BATCHING_LABELS[kind]} | " + " | ".join(cells) + " |")
    return lines


def scaling_table(rows: list[dict[str, Any]]) -> list[str]:
    """The appliance's rows of the scaling part, one line per (instances, frontends, clients)."""
    ours = {system.name for system in APPLIANCE}
    rows = [r for r in rows if r["system"] in ours]
    cells = sorted({(r["system"], r["payload"]) for r in rows})
    head = " | ".join(f"{s} {p} req/s (server µs/req)" for s, p in cells)
    lines = [
        f"| model instances | frontends | clients | {head} |",
        "|---|---|---|" + "---|" * len(cells),
    ]
    groups = sorted({(r["instances"], r["frontends"], r.get("concurrency", 16)) for r in rows})
    for instances, frontends, clients in groups:
        values = []
        for system, payload in cells:
            row = find(
                rows,
                instances=instances,
                frontends=frontends,
                concurrency=clients,
                system=system,
                payload=payload,
            )
            values.append(f"{fmt(row and row['rps'])} ({fmt(row and row['server_cpu_us'])})")
        lines.append(f"| {instances} | {frontends} | {clients} | " + " | ".join(values) + " |")
    return lines


def scaling_peers_table(rows: list[dict[str, Any]]) -> list[str]:
    """The peers beside the scaling grid: floors per worker count, MLServer per parallel_workers."""
    ours = {system.name for system in APPLIANCE}
    rows = sorted(
        (r for r in rows if r["system"] not in ours),
        key=lambda r: (r["system"], r["frontends"], r["instances"], r.get("concurrency", 16)),
    )
    lines = [
        "| peer, 16 B | worker processes | MLServer parallel_workers | clients "
        "| req/s (server µs/req) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        pw = r["instances"] if r["system"].startswith("mlserver") else "-"
        lines.append(
            f"| {r['system']} | {r['frontends']} | {pw} | {r.get('concurrency', 16)} "
            f"| {fmt(r['rps'])} ({fmt(r['server_cpu_us'])}) |"
        )
    return lines


def target_lines(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | value | limit | verdict | measured |", "|---|---|---|---|---|"]
    for item in targets:
        verdict = {True: "met", False: "**MISSED**", None: unjudged(item)}[item["met"]]
        unit = item.get("unit", "ratio")
        value = fmt(item["value"], {"ms": "p50_ms", "us": "rps"}.get(unit, "ratio"))
        lines.append(
            f"| {item['target']} | {value} | {item['limit']} | {verdict} | {item['detail']} |"
        )
    return lines


def render(
    record: dict[str, Any],
    summary: Summary,
    ratios: list[dict[str, Any]],
    batching: list[dict[str, Any]],
    scaling: list[dict[str, Any]],
    targets: list[dict[str, Any]],
    loops: list[dict[str, Any]] | None = None,
    hops: list[dict[str, Any]] | None = None,
) -> str:
    """The markdown between the page's markers."""
    del ratios  # the ratio table is computed from the summary, column by column
    args = record["args"]
    when = datetime.date.today().isoformat()
    start = ", ".join(f"{x:.1f}" for x in record["load_average_start"])
    end = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    out = [
        f"Measured by `bench/bench_peers.py` on {when}: {os.cpu_count()} vCPUs, Python "
        f"{sys.version.split()[0]}, load average {start} at the start and {end} at the end; "
        f"{record['grid_repeats']} repeat(s) of {args['seconds']:g} s per cell (every other "
        "repeat runs the systems in reverse order), medians; the whole run took "
        f"{record['elapsed_s'] / 60:.0f} min. c = client processes, each with one request in "
        "flight. The load generator shares the 2 vCPUs with the server: server µs/req (CPU "
        "of the server's whole process tree per request, psutil) does not depend on it.",
        "",
        *grid_table(summary),
        "",
        "Ratios, appliance over peer, same client and wire (req/s: higher is better for the "
        "appliance; latency and µs/req: lower is):",
        "",
        *ratio_table(summary),
        "",
        *http_tables(summary),
        "",
        "`server.event_loop` (appliance/frontends/loops.py), A and B in this run: an "
        "appliance on each loop, back to back, the order alternating between repeats:",
        "",
        *event_loop_table(loops or []),
        "",
        "CPU per request thread by thread (bench/threads.py; issue 55): the identity "
        "cells of KServe REST JSON and gRPC at 1 and 8 clients, each thread kind and each "
        "process of the appliance beside Triton's (its tritonserver and its Python stub, "
        "on the model worker's line), the floors' and the hop's floor's (ZeroMQ alone, its "
        "client on the frontend's line), all measured in this run:",
        *thread_tables.peers_tables(summary, hops or []),
        "",
        "Targets (issues 10, 18, 20, 34, 45 and 55):",
        "",
        *target_lines(targets),
        "",
        f"Dynamic batching (max_batch_size 64 with max_queue_delay_ms {BATCH_DELAY_MS:g} against "
        "max_batch_size 0; the last "
        "column is unbatched over batched server CPU per request, what batching saves the "
        "server whatever the load generator can drive). `digits` computes in 15-60 µs, "
        "less than a request's trip through a frontend; `digits + "
        f"{CALL_COST_MS:g} ms per call` (bench/peers/appliance_models.py) waits that long "
        "per call whatever the rows, like an accelerator launch, so the model is the "
        "bottleneck there:",
        "",
        *batching_table(batching),
        "",
        f"Scaling. **This machine: {record.get('scaling_note', '2 CPUs')}**:",
        "",
        *scaling_table(scaling),
        "",
        "The peers in the same run, on the same CPUs:",
        "",
        *scaling_peers_table(scaling),
        "",
        *_peer_notes(record),
        "",
        f"![latency against throughput]({PLOT})",
    ]
    return "\n".join(out)


def render_scaling(
    record: dict[str, Any], scaling: list[dict[str, Any]], targets: list[dict[str, Any]]
) -> str:
    """The markdown of a many-core host's scaling-only run (its table on the page)."""
    machine, args = record["machine"], record["args"]
    start = ", ".join(f"{x:.1f}" for x in record["load_average_start"])
    cut = " It was stopped at its time bound; cells after that are missing." * bool(
        record.get("cut_short")
    )
    out = [
        f"Measured by `bench/bench_peers.py --scaling-only` on {record.get('date', 'n/a')}: "
        f"{machine['cpus']} CPUs ({machine['platform']}), Python {machine['python']}, load "
        f"average {start} at the start; {args['repeats']} repeat(s) of {args['seconds']:g} s "
        f"per cell, medians; the run took {record['elapsed_s'] / 60:.0f} min.{cut} "
        f"**{record.get('scaling_note', '')}**; each cell is its own appliance with that many "
        "model instances and frontend processes per protocol (server µs/req: CPU of the "
        "server's whole process tree per request, psutil).",
        "",
        *scaling_table(scaling),
        "",
        "The peers in the same run, on the same CPUs:",
        "",
        *scaling_peers_table(scaling),
        "",
        "Targets (issue 20):",
        "",
        *target_lines(targets),
    ]
    return "\n".join(out)


def _peer_notes(record: dict[str, Any]) -> list[str]:
    notes = [f"- No peer for {name}: {why}." for name, why in NO_PEER.items()]
    for name, peer in record["peers"].items():
        if not peer["available"]:
            notes.append(f"- {name} could not run here: {peer['reason']}")
    notes.append(
        "- MLServer speaks no binary tensor extension over REST: its REST rows (and the "
        "appliance rows they are compared with) carry JSON tensors."
    )
    return notes


def update(page: Path, text: str, tag: str = TAG) -> bool:
    """Replace what stands between ``tag``'s markers; False (and a warning) without them."""
    begin, end_marker = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    body = page.read_text()
    start, end = body.find(begin), body.find(end_marker)
    if start < 0 or end < start:
        print(f"{page.name} has no {begin} ... {end_marker} markers: table not written")
        return False
    page.write_text(body[: start + len(begin)] + "\n" + text + "\n" + body[end:])
    return True


def print_extras(
    ratios: list[dict[str, Any]],
    paced: list[dict[str, Any]],
    batching: list[dict[str, Any]],
    scaling: list[dict[str, Any]],
    note: str = "2 CPUs",
) -> None:
    print("\nappliance / peer, same client and wire (rps: >1 better; p50, p99, cpu: <1 better)")
    for r in ratios:
        print(
            f"  {r['appliance']:>17} / {r['peer']:<24}{r['payload']:>7} c={r['concurrency']:<3}"
            f" rps {r['rps']:6.2f}  p50 {r['p50']:6.2f}  p99 {r['p99']:6.2f}"
            f"  cpu {r['server_cpu']:6.2f}"
        )
    print("\nequal offered load, 16 clients, 16 B (paced; latency from the scheduled time)")
    for r in paced:
        print(
            f"  {r['system']:<24} offered {r['offered_rps']:7.0f}  got {r['rps']:7.0f}"
            f"  p50 {r['p50_ms']:7.3f}  p99 {r['p99_ms']:7.3f} ms"
        )
    print("\n" + "\n".join(batching_table(batching)))
    print(f"\nscaling ({note})\n" + "\n".join(scaling_table(scaling)))
    print("\n" + "\n".join(scaling_peers_table(scaling)))
