"""The issues' targets against peers and floors, from bench_peers.py's medians.

Each target is a :func:`bench.report.target` record: its value in this run,
its limit, met / MISSED (None: not measured, or no verdict on this host).
Real Triton's and the per-thread targets (issues 45 and 55) are in
bench/triton_targets.py; :func:`targets` gathers them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.plan import APPLIANCE
from bench.report import Summary, cell, find, ratio, target
from bench.report import ms as _ms
from bench.report import rps as _rps
from bench.report import throughput_detail as _throughput_detail
from bench.report import us as _us
from bench.triton_targets import shm_target, thread_targets, triton_targets


def targets(
    summary: Summary, paced: list[dict[str, Any]], batching: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The issue's targets, each computed from this run's medians."""

    def get(system: str, payload: str, concurrency: int, key: str) -> float | None:
        row = cell(summary, system, payload, concurrency)
        return None if row is None else float(row[key])

    out = []
    ours = get("kserve-rest-json", "16B", 1, "p50_ms")
    for peer, limit in (("mlserver-pw1 rest-json", 0.35), ("mlserver-pw0 rest-json", 1.0)):
        theirs = get(peer, "16B", 1, "p50_ms")
        out.append(
            target(
                f"1 client, 16 B, KServe REST p50 vs {peer}",
                ratio(ours, theirs),
                limit,
                True,
                f"{_ms(ours)} vs {_ms(theirs)} (tritonclient.http, JSON tensors both sides)",
            )
        )
    for payload, limit in (("16B", 2.0), ("1MiB", 3.0)):
        for ours_name, peer in (
            ("kserve-rest-json", "mlserver-pw1 rest-json"),
            ("kserve-grpc", "mlserver-pw1 grpc"),
        ):
            a, b = cell(summary, ours_name, payload, 16), cell(summary, peer, payload, 16)
            detail = _throughput_detail(a, b)
            if ours_name == "kserve-rest-json":
                binary = cell(summary, "kserve-rest", payload, 16)
                rps = _rps(binary and binary["rps"])
                detail += f"; appliance with binary tensors (tritonclient's default): {rps} req/s"
            out.append(
                target(
                    f"16 clients, {payload}, {ours_name} throughput vs {peer}",
                    ratio(a and a["rps"], b and b["rps"]),
                    limit,
                    False,
                    detail,
                )
            )
    for ours_name, peer in (
        ("kserve-rest-json", "mlserver-pw0 rest-json"),
        ("kserve-grpc", "mlserver-pw0 grpc"),
    ):
        a, b = cell(summary, ours_name, "16B", 16), cell(summary, peer, "16B", 16)
        out.append(
            target(
                f"16 clients, 16 B, {ours_name} throughput vs {peer} (in-process)",
                ratio(a and a["rps"], b and b["rps"]),
                1.0,
                False,
                _throughput_detail(a, b),
            )
        )
    out += _paced_targets(paced)
    out += _floor_targets(get)
    out += _umbridge_targets(summary)
    out += _http_stack_targets(summary, get)
    out += _digits_latency_targets(get)
    out += _batching_targets(batching)
    out += shm_target(get)
    out += triton_targets(get)
    out += thread_targets(summary)
    return out


def _paced_targets(paced: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for ours_name, peer in (
        ("kserve-rest-json", "mlserver-pw1 rest-json"),
        ("kserve-grpc", "mlserver-pw1 grpc"),
    ):
        a, b = find(paced, system=ours_name), find(paced, system=peer)
        rate = a["offered_rps"] if a else math.nan
        out.append(
            target(
                f"16 clients, 16 B, {ours_name} p99 at equal offered load vs {peer}",
                ratio(a and a["p99_ms"], b and b["p99_ms"]),
                1.0,
                True,
                f"{_ms(a and a['p99_ms'])} vs {_ms(b and b['p99_ms'])} at {rate:.0f} req/s offered",
            )
        )
    return out


# Each protocol's floor: the same stack answering in place, no model, no process hop.
FLOORS = (
    ("kserve-rest", "floor-asgi", "falcon+gunicorn (ASGI)"),
    ("kserve-grpc", "floor-grpc-aio", "grpc.aio"),
)


def _floor_targets(get: Any) -> list[dict[str, Any]]:
    # The hop alone (direct) beside each floor: the least a protocol that
    # crosses it can add, measured in the same run.
    hop_ms, hop_cpu = get("direct", "16B", 1, "p50_ms"), get("direct", "16B", 16, "server_cpu_us")
    out = []
    for ours_name, floor_name, stack in FLOORS:
        ours, floor = get(ours_name, "16B", 1, "p50_ms"), get(floor_name, "16B", 1, "p50_ms")
        out.append(
            target(
                f"1 client, 16 B, {ours_name} p50 vs the {stack} floor",
                ratio(ours, floor),
                1.5,
                True,
                f"{_ms(ours)} vs {_ms(floor)}" + _with_hop(floor, hop_ms, _ms),
            )
        )
        ours, floor = (
            get(ours_name, "16B", 16, "server_cpu_us"),
            get(floor_name, "16B", 16, "server_cpu_us"),
        )
        out.append(
            target(
                f"16 clients, 16 B, {ours_name} server CPU per request vs the {stack} floor",
                ratio(ours, floor),
                2.0,
                True,
                f"{_us(ours)} vs {_us(floor)} µs/req; {_rps(get(ours_name, '16B', 16, 'rps'))}"
                f" vs {_rps(get(floor_name, '16B', 16, 'rps'))} req/s"
                + _with_hop(floor, hop_cpu, lambda v: f"{_us(v)} µs/req"),
            )
        )
    return out


def _with_hop(floor: float | None, hop: float | None, show: Callable[[Any], str]) -> str:
    """The floor plus the hop alone (direct, the model worker's side for CPU), as a ratio."""
    if floor is None or hop is None:
        return ""
    return (
        f"; the hop alone (direct) {show(hop)}, floor + hop {show(floor + hop)}"
        f" = {(floor + hop) / floor:.2f}x the floor"
    )


def _umbridge_targets(summary: Summary) -> list[dict[str, Any]]:
    ours, ref = cell(summary, "umbridge", "16B", 1), cell(summary, "umbridge-ref", "16B", 1)
    out = [
        target(
            "1 client, UM-Bridge Evaluate p50 vs UM-Bridge's own server",
            ratio(ours and ours["p50_ms"], ref and ref["p50_ms"]),
            1.0,
            True,
            f"{_ms(ours and ours['p50_ms'])} vs {_ms(ref and ref['p50_ms'])}",
        )
    ]
    ours, ref = cell(summary, "umbridge", "16B", 16), cell(summary, "umbridge-ref", "16B", 16)
    out.append(
        target(
            "16 clients, UM-Bridge Evaluate throughput vs UM-Bridge's own server",
            ratio(ours and ours["rps"], ref and ref["rps"]),
            1.0,
            False,
            _throughput_detail(ours, ref),
        )
    )
    return out


def _http_stack_targets(summary: Summary, get: Any) -> list[dict[str, Any]]:
    """Issue 34: UM-Bridge with its own client, the REST path against floor + hop,
    and what a new connection costs."""
    out = []
    ours1, ref1 = (
        cell(summary, "umbridge newconn", "16B", 1),
        cell(summary, "umbridge-ref newconn", "16B", 1),
    )
    ours16, ref16 = (
        cell(summary, "umbridge newconn", "16B", 16),
        cell(summary, "umbridge-ref newconn", "16B", 16),
    )
    client = "umbridge.HTTPModel, a connection per call"
    out.append(
        target(
            "1 client, UM-Bridge Evaluate p50 vs UM-Bridge's own server, with its own client",
            ratio(ours1 and ours1["p50_ms"], ref1 and ref1["p50_ms"]),
            1.0,
            True,
            f"{_ms(ours1 and ours1['p50_ms'])} vs {_ms(ref1 and ref1['p50_ms'])} ({client})",
        )
    )
    out.append(
        target(
            "16 clients, UM-Bridge Evaluate throughput vs UM-Bridge's own server, "
            "with its own client",
            ratio(ours16 and ours16["rps"], ref16 and ref16["rps"]),
            1.2,
            False,
            _throughput_detail(ours16, ref16) + f" ({client})",
        )
    )
    out.append(
        target(
            "1 client, UM-Bridge Evaluate server CPU per call vs UM-Bridge's own server, "
            "with its own client",
            ratio(ours1 and ours1["server_cpu_us"], ref1 and ref1["server_cpu_us"]),
            1.5,
            True,
            f"{_us(ours1 and ours1['server_cpu_us'])} vs "
            f"{_us(ref1 and ref1['server_cpu_us'])} µs/call; at 16 clients "
            f"{_us(ours16 and ours16['server_cpu_us'])} vs "
            f"{_us(ref16 and ref16['server_cpu_us'])} ({client})",
        )
    )
    ours, floor, hop = (get(n, "16B", 1, "p50_ms") for n in ("kserve-rest", "floor-asgi", "direct"))
    both = None if floor is None or hop is None else floor + hop
    out.append(
        target(
            "1 client, 16 B, kserve-rest p50 minus (the gunicorn-ASGI floor's + the hop's)",
            math.nan if ours is None or both is None else ours - both,
            0.10,
            True,
            f"{_ms(ours)} vs {_ms(floor)} + {_ms(hop)} (direct) = {_ms(both)}",
            unit="ms",
        )
    )
    ours, floor, hop = (
        get(n, "16B", 16, "server_cpu_us") for n in ("kserve-rest", "floor-asgi", "direct")
    )
    both = None if floor is None or hop is None else floor + hop
    out.append(
        target(
            "16 clients, 16 B, kserve-rest server CPU per request minus "
            "(the gunicorn-ASGI floor's + the hop's)",
            math.nan if ours is None or both is None else ours - both,
            100.0,
            True,
            f"{_us(ours)} vs {_us(floor)} + {_us(hop)} (direct) = {_us(both)} µs/req",
            unit="us",
        )
    )
    for clients in (1, 16):
        fresh = get("kserve-rest newconn", "16B", clients, "server_cpu_us")
        kept = get("kserve-rest", "16B", clients, "server_cpu_us")
        out.append(
            target(
                f"{clients} client(s), 16 B, kserve-rest server CPU per request: "
                "a new connection each vs keep-alive",
                ratio(fresh, kept),
                1.5,
                True,
                f"{_us(fresh)} vs {_us(kept)} µs/req",
            )
        )
    return out


def _digits_latency_targets(get: Any) -> list[dict[str, Any]]:
    """A batched model answers a lone request as fast as an unbatched identity does."""
    out = []
    for system in APPLIANCE:
        digits, identity = (
            get(system.name, "digits", 1, "p50_ms"),
            get(system.name, "16B", 1, "p50_ms"),
        )
        if digits is None:
            continue
        out.append(
            target(
                f"1 client, digits p50 minus identity p50 over {system.name}",
                digits - identity if identity is not None else math.nan,
                0.2,
                True,
                f"{_ms(digits)} vs {_ms(identity)}",
                unit="ms",
            )
        )
    return out


def _batching_targets(batching: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for protocol in sorted({row["system"] for row in batching}):
        on = find(batching, system=protocol, payload="digits")
        off = find(batching, system=protocol, payload="digits-unbatched")
        detail = (
            _throughput_detail(on, off)
            + f"; {on['rows_per_batch'] if on else math.nan:.1f} rows per batch"
        )
        out.append(
            target(
                f"64 clients, digits over {protocol}: batching on / off server CPU per request",
                ratio(on and on["server_cpu_us"], off and off["server_cpu_us"]),
                0.33,
                True,
                detail,
            )
        )
        out.append(
            target(
                f"64 clients, digits over {protocol}: batching on / off throughput",
                ratio(on and on["rps"], off and off["rps"]),
                1.0,
                False,
                detail,
            )
        )
    return out


# Issue 20's targets are for a 16-core host at this many clients.
SCALING_TARGET_CLIENTS = 64


def scaling_targets(scaling: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The many-core targets, from the scaling part's medians (bench_peers ``scaling``).

    The appliance counts with the best configuration of the grid (named in the
    detail), the floors with the same worker count. Below
    SCALING_TARGET_CLIENTS (a small host's grid) the ratios are shown and no
    verdict is given.
    """
    if not scaling:
        return []
    measured = {int(r.get("concurrency", 16)) for r in scaling}
    # The targets are for SCALING_TARGET_CLIENTS; a small host's grid stops below.
    clients = SCALING_TARGET_CLIENTS if SCALING_TARGET_CLIENTS in measured else max(measured)
    small = clients < SCALING_TARGET_CLIENTS

    def rows(system: str, payload: str = "16B", **match: Any) -> list[dict[str, Any]]:
        return [
            r
            for r in scaling
            if r["system"] == system
            and r["payload"] == payload
            and r.get("concurrency", 16) == clients
            and r["requests"]
            and all(r.get(k) == v for k, v in match.items())
        ]

    def best(system: str) -> dict[str, Any] | None:
        return max(rows(system), key=lambda r: r["rps"], default=None)

    def where(row: dict[str, Any] | None) -> str:
        if row is None:
            return "not measured"
        return f"{_rps(row['rps'])} req/s ({row['frontends']} frontends, {row['instances']} inst.)"

    out = []
    for ours_name, peer, limit in (
        ("kserve-rest-json", "mlserver-pw0 rest-json", 3.0),
        ("kserve-rest-json", "mlserver-pw4 rest-json", 1.5),
        ("kserve-grpc", "mlserver-pw0 grpc", 3.0),
    ):
        a, b = best(ours_name), best(peer)
        out.append(
            target(
                f"{clients} clients, 16 B, {ours_name} throughput vs {peer}",
                ratio(a and a["rps"], b and b["rps"]),
                limit,
                False,
                f"{where(a)} vs {_rps(b and b['rps'])} req/s",
            )
        )
    pairs = []
    for floor in rows("floor-asgi"):
        ours = rows("kserve-rest", instances=1, frontends=floor["frontends"])
        if ours:
            pairs.append((floor["frontends"], ratio(ours[0]["rps"], floor["rps"])))
    worst = min((r for _f, r in pairs), default=math.nan)
    out.append(
        target(
            f"{clients} clients, 16 B, kserve-rest throughput vs floor-asgi, same workers (worst)",
            worst,
            0.5,
            False,
            ", ".join(f"{f} workers {r:.2f}x" for f, r in pairs) or "not measured",
        )
    )
    digits = rows("kserve-grpc", "digits-unbatched")
    both = {r["frontends"] for r in digits if r["instances"] == 1} & {
        r["frontends"] for r in digits if r["instances"] == 4
    }
    most = max(both, default=1)
    one, four = (
        next(
            (
                r["rps"]
                for r in rows("kserve-grpc", "digits-unbatched", instances=n, frontends=most)
            ),
            None,
        )
        for n in (1, 4)
    )
    out.append(
        target(
            f"{clients} clients, digits over kserve-grpc, 4 instances vs 1 ({most} frontends)",
            ratio(four, one),
            3.0,
            False,
            f"{_rps(four)} vs {_rps(one)} req/s",
        )
    )
    for item in out:
        item["target"] += " (issue 20)"
        if small:
            item["met"] = None
            item["detail"] += f"; no verdict: the target is for {SCALING_TARGET_CLIENTS} clients"
    return out
