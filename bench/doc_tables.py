"""bench_peers.py's tables: the console's extras and the manual's performance page.

:func:`render` builds the markdown that :func:`update` puts between the
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` markers in
docs/performance.md (:data:`PAGE`), so a rerun replaces the table and nothing
else; bench_gpu.py and bench_models.py put theirs there the same way, between
markers of their own. :func:`readme_http` builds the README's HTTP tables (the
floors, the new connections, the ladder), which every run puts between the
README's ``<!-- bench-http:begin -->`` and ``<!-- bench-http:end -->``.
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import sys
from pathlib import Path
from typing import Any

from bench.plan import (
    APPLIANCE,
    BATCH_DELAY_MS,
    BATCHING_MODELS,
    CALL_COST_MS,
    FLOORS,
    HTTP_PROTOCOLS,
    LADDER,
    LADDER_RUNGS,
    NEWCONN_TAG,
    NO_PEER,
    PEERS,
    SYSTEMS,
)
from bench.report import Summary, cell, find, ratio

# The page the benchmarks write their tables into (mkdocs builds it; its
# image paths are relative to docs/).
PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
# The table sits between <!-- TAG:begin --> and <!-- TAG:end -->: "bench" for
# this machine kind, "bench-<N>core" for a many-core host's run beside it.
TAG = "bench"
# The latency-throughput plot as the page shows it: docs/assets/peers.png is a
# link to bench/results/peers.png, which bench_peers.py draws.
PLOT = "assets/peers.png"
LABELS = {
    "kserve-grpc": "appliance, KServe gRPC",
    "kserve-rest": "appliance, KServe REST (binary)",
    "kserve-rest-json": "appliance, KServe REST (JSON)",
    "kserve-shm": "appliance, KServe gRPC + system shm",
    "kserve-shm-rest": "appliance, KServe REST + system shm",
    "grps-rest": "appliance, GRPS REST (JSON)",
    "grps-grpc": "appliance, GRPS gRPC",
    "graphpipe": "appliance, GraphPipe",
    "umbridge": "appliance, UM-Bridge (JSON)",
    "mip": "appliance, MIP (TENSOR items)",
    "direct": "appliance, its own client (the hop alone, no frontend)",
    "triton grpc": "Triton 2.51 (Python backend), KServe gRPC",
    "triton rest": "Triton 2.51 (Python backend), KServe REST (binary)",
    "triton rest-json": "Triton 2.51 (Python backend), KServe REST (JSON)",
    "triton shm": "Triton 2.51 (Python backend), KServe gRPC + system shm",
    "triton shm-rest": "Triton 2.51 (Python backend), KServe REST + system shm",
    "mlserver-pw1 grpc": "MLServer 1.7.1 pw=1, gRPC",
    "mlserver-pw1 rest-json": "MLServer 1.7.1 pw=1, REST (JSON)",
    "mlserver-pw0 grpc": "MLServer 1.7.1 pw=0, gRPC",
    "mlserver-pw0 rest-json": "MLServer 1.7.1 pw=0, REST (JSON)",
    "umbridge-ref": "UM-Bridge 1.2.10 server",
    "floor-uvicorn": "falcon+gunicorn floor, uvicorn's worker (uvloop, httptools)",
    "floor-asgi": "falcon+gunicorn floor, gunicorn's ASGI worker (asyncio)",
    "floor-asgi-uvloop": "falcon+gunicorn floor, gunicorn's ASGI worker on uvloop",
    "floor-gthread": "falcon+gunicorn floor, gthread",
    "floor-sync": "falcon+gunicorn floor, sync",
    "floor-grpc-aio": "grpcio floor, aio",
    "floor-grpc-sync": "grpcio floor, sync thread pool",
}
LABELS |= {
    f"{name} {NEWCONN_TAG}": f"{LABELS[name]}, a new connection per request"
    for name in (*HTTP_PROTOCOLS, *FLOORS, "umbridge-ref")
}
LABELS |= {system.name: system.name for system in LADDER}
# Rows with tables of their own (floors_table, connections_table, ladder_table).
OWN_TABLES = {s.name for s in LADDER} | {n for n in SYSTEMS if n.endswith(f" {NEWCONN_TAG}")}
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


def fmt(value: float | None, key: str = "rps") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if key in ("p50_ms", "p99_ms"):
        return f"{value:.2f}"
    if key == "ratio":
        return f"{value:.2f}x"
    return f"{value:,.0f}"


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


def _cpu_and_p50(summary: Summary, name: str, concurrency: int) -> tuple[str, str]:
    row = cell(summary, name, "16B", concurrency)
    p50 = fmt(row["p50_ms"] * 1000 if row else None)
    return p50, fmt(row and row["server_cpu_us"])


def _rps_and_cpu(summary: Summary, name: str) -> tuple[str, str]:
    row = cell(summary, name, "16B", 16)
    return fmt(row and row["rps"]), fmt(row and row["server_cpu_us"])


def floors_table(summary: Summary) -> list[str]:
    """The falcon floor under each HTTP stack, kept-alive and a connection per request."""
    lines = [
        "| HTTP stack under gunicorn, falcon answering KServe REST in place, 16 B "
        "| keep-alive c=1 p50 µs | c=1 server µs/req | c=16 req/s | c=16 server µs/req "
        "| new connection c=1 p50 µs | c=1 server µs/req | c=16 req/s | c=16 server µs/req "
        "| server µs/req vs gunicorn's ASGI worker, c=1 keep-alive / new connection |",
        "|---" * 10 + "|",
    ]
    base = cell(summary, "floor-asgi", "16B", 1)
    base_new = cell(summary, f"floor-asgi {NEWCONN_TAG}", "16B", 1)
    for name in FLOORS:
        if name not in summary:
            continue
        fresh = f"{name} {NEWCONN_TAG}"
        kept_row, fresh_row = cell(summary, name, "16B", 1), cell(summary, fresh, "16B", 1)
        ratios = (
            fmt(
                ratio(kept_row and kept_row["server_cpu_us"], base and base["server_cpu_us"]),
                "ratio",
            )
            + " / "
            + fmt(
                ratio(
                    fresh_row and fresh_row["server_cpu_us"],
                    base_new and base_new["server_cpu_us"],
                ),
                "ratio",
            )
        )
        cells = [
            *_cpu_and_p50(summary, name, 1),
            *_rps_and_cpu(summary, name),
            *_cpu_and_p50(summary, fresh, 1),
            *_rps_and_cpu(summary, fresh),
            ratios,
        ]
        lines.append(
            f"| {LABELS[name].removeprefix('falcon+gunicorn floor, ')} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def connections_table(summary: Summary) -> list[str]:
    """Each HTTP protocol (and UM-Bridge's own server) kept-alive and a connection per request."""
    lines = [
        "| 16 B | keep-alive c=1 p50 µs | c=1 server µs/req | c=16 req/s | c=16 server µs/req "
        "| new connection c=1 p50 µs | c=1 server µs/req | c=16 req/s | c=16 server µs/req "
        "| new / keep-alive server µs/req, c=1 |",
        "|---" * 10 + "|",
    ]
    for name in (*HTTP_PROTOCOLS, "umbridge-ref"):
        fresh = f"{name} {NEWCONN_TAG}"
        if fresh not in summary:
            continue
        kept_row, fresh_row = cell(summary, name, "16B", 1), cell(summary, fresh, "16B", 1)
        growth = ratio(
            fresh_row and fresh_row["server_cpu_us"], kept_row and kept_row["server_cpu_us"]
        )
        cells = [
            *_cpu_and_p50(summary, name, 1),
            *_rps_and_cpu(summary, name),
            *_cpu_and_p50(summary, fresh, 1),
            *_rps_and_cpu(summary, fresh),
            fmt(growth, "ratio"),
        ]
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    return lines


def ladder_table(summary: Summary) -> list[str]:
    """One request's rungs per HTTP protocol: p50 and server CPU, each with what it adds."""
    steps = (*(f"ladder-{rung}" for rung in LADDER_RUNGS), "appliance")
    heads = (
        "floor (the appliance's worker, falcon, answers in place)",
        "+ the appliance's middleware",
        "+ the protocol's codec (a client answering in place)",
        "+ the hop (the whole appliance)",
    )
    lines = [
        "| 1 client, 16 B, p50 µs (added) / server µs/req (added) | " + " | ".join(heads) + " |",
        "|---" * (len(heads) + 1) + "|",
    ]
    for protocol in HTTP_PROTOCOLS:
        cells, before = [], None
        for step in steps:
            name = protocol if step == "appliance" else f"{step} {protocol}"
            row = cell(summary, name, "16B", 1)
            now = (row["p50_ms"] * 1000, row["server_cpu_us"]) if row else None
            text = "n/a"
            if now is not None:
                text = f"{now[0]:,.0f} / {now[1]:,.0f}"
                if before is not None:
                    text += f" ({now[0] - before[0]:+,.0f} / {now[1] - before[1]:+,.0f})"
            cells.append(text)
            before = now
        if any(c != "n/a" for c in cells):
            lines.append(
                f"| {LABELS[protocol].removeprefix('appliance, ')} | " + " | ".join(cells) + " |"
            )
    hop = cell(summary, "direct", "16B", 1)
    if hop is not None:
        lines.append(
            f"| the hop alone (`direct`: the appliance's client, no frontend) | | | | "
            f"{hop['p50_ms'] * 1000:,.0f} / {hop['server_cpu_us']:,.0f} |"
        )
    return lines


def http_tables(summary: Summary) -> list[str]:
    """The floors, the connections and the ladder, with what each shows (page and console)."""
    return [
        "The HTTP stacks gunicorn can run, each serving the falcon floor app (bench/peers/"
        "floor_asgi_app.py; one worker, as the appliance on this machine). The appliance's HTTP "
        'frontend runs uvicorn\'s worker class (bench/profiles/README.md, "The HTTP stack"):',
        "",
        *floors_table(summary),
        "",
        "A new connection per request (UM-Bridge's `HTTPModel`, GraphPipe's `remote.execute` and "
        "curl-style clients call `requests.post`) against a kept-alive one; UM-Bridge's rows "
        "use its own client for the new connections:",
        "",
        *connections_table(summary),
        "",
        "The ladder of one request (bench/peers/ladder_app.py), each rung a server on the "
        "appliance's own HTTP worker: where the microseconds of a lone REST request go:",
        "",
        *ladder_table(summary),
    ]


def readme_http(record: dict[str, Any], summary: Summary) -> str:
    """The README's HTTP tables: the floors, the new connections and the ladder, this run's."""
    args = record["args"]
    how = "--quick " * bool(args["quick"]) + "--no-scaling " * bool(args["no_scaling"])
    return "\n".join(
        [
            f"`bench/bench_peers.py {how}--repeats {record['grid_repeats']}` on "
            f"{datetime.date.today().isoformat()}, {os.cpu_count()} vCPUs: medians of "
            f"{record['grid_repeats']} repeat(s) of {args['seconds']:g} s per cell, server µs/req "
            "the CPU of the server's whole process tree per request. "
            "[The performance page](docs/performance.md) has every row and the targets.",
            "",
            *http_tables(summary),
        ]
    )


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
        verdict = {True: "met", False: "**MISSED**", None: "not measured"}[item["met"]]
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
        "Targets (issues 10, 18, 20 and 34):",
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
