"""bench_peers.py's HTTP tables (the floors, new connections, the ladder) and the rows'
labels, for the performance page (bench/doc_tables.py).

:func:`http_section` builds the HTTP stack's tables, which every run puts between
the performance page's ``<!-- bench-http:begin -->`` and ``<!-- bench-http:end -->``.
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Any

from bench.plan import FLOORS, HTTP_PROTOCOLS, LADDER, LADDER_RUNGS, NEWCONN_TAG, SYSTEMS
from bench.report import Summary, cell, ratio

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
    "floor-grpc-aio-hop": "grpcio floor, aio, with a ZeroMQ hop",
    "floor-grpc-aio-codec": "grpcio floor, aio, through the appliance's codec",
    "floor-grpc-sync": "grpcio floor, sync thread pool",
}
LABELS |= {
    f"{name} {NEWCONN_TAG}": f"{LABELS[name]}, a new connection per request"
    for name in (*HTTP_PROTOCOLS, *FLOORS, "umbridge-ref")
}
LABELS |= {system.name: system.name for system in LADDER}
# Rows with tables of their own (floors_table, connections_table, ladder_table).
OWN_TABLES = {s.name for s in LADDER} | {n for n in SYSTEMS if n.endswith(f" {NEWCONN_TAG}")}


def fmt(value: float | None, key: str = "rps") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if key in ("p50_ms", "p99_ms"):
        return f"{value:.2f}"
    if key == "ratio":
        return f"{value:.2f}x"
    return f"{value:,.0f}"


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


def http_section(record: dict[str, Any], summary: Summary) -> str:
    """The HTTP stack's tables: the floors, the new connections and the ladder, this run's."""
    args = record["args"]
    how = "--quick " * bool(args["quick"]) + "--no-scaling " * bool(args["no_scaling"])
    return "\n".join(
        [
            f"`bench/bench_peers.py {how}--repeats {record['grid_repeats']}` on "
            f"{datetime.date.today().isoformat()}, {os.cpu_count()} vCPUs: medians of "
            f"{record['grid_repeats']} repeat(s) of {args['seconds']:g} s per cell, server µs/req "
            "the CPU of the server's whole process tree per request (every row and the "
            "targets: below).",
            "",
            *http_tables(summary),
        ]
    )
