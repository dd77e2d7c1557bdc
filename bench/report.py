"""bench_peers.py's numbers: medians, appliance/peer ratios, the issue's targets.

Everything here reads the run's record (rows of every repeat) and returns
plain data; bench/doc_tables.py turns it into markdown.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench.loadgen import median_row
from bench.plan import APPLIANCE, PEERS, SYSTEMS

Summary = dict[str, dict[str, dict[int, dict[str, Any]]]]


def summarise(rows: list[dict[str, Any]]) -> Summary:
    """Medians over repeats: summary[system][payload][concurrency] -> row."""
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[(row["system"], row["payload"], row["concurrency"])].append(row)
    summary: Summary = defaultdict(lambda: defaultdict(dict))
    for (system, payload, concurrency), repeats in grouped.items():
        merged = median_row(repeats)
        merged["repeats"] = len(repeats)
        merged["errors"] = sum(r["errors"] for r in repeats)
        merged["error"] = next((r["error"] for r in repeats if r["error"]), None)
        summary[system][payload][concurrency] = merged
    return summary


def cell(summary: Summary, system: str, payload: str, concurrency: int) -> dict[str, Any] | None:
    row = summary.get(system, {}).get(payload, {}).get(concurrency)
    if row is None or not row["requests"]:
        return None
    return row


def ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b


def peer_ratios(summary: Summary) -> list[dict[str, Any]]:
    """appliance/peer per row: throughput, p50, p99 and server CPU per request."""
    out = []
    for peer in PEERS:
        assert peer.versus is not None
        for payload, by_level in summary.get(peer.name, {}).items():
            for concurrency, theirs in by_level.items():
                ours = cell(summary, peer.versus, payload, concurrency)
                if ours is None or not theirs["requests"]:
                    continue
                out.append(
                    {
                        "appliance": peer.versus,
                        "peer": peer.name,
                        "payload": payload,
                        "concurrency": concurrency,
                        "rps": ratio(ours["rps"], theirs["rps"]),
                        "p50": ratio(ours["p50_ms"], theirs["p50_ms"]),
                        "p99": ratio(ours["p99_ms"], theirs["p99_ms"]),
                        "server_cpu": ratio(ours["server_cpu_us"], theirs["server_cpu_us"]),
                    }
                )
    return out


def grouped_medians(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Medians of rows that agree on ``keys`` (paced, batching and scaling rows)."""
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[tuple(row[k] for k in keys)].append(row)
    out = []
    for repeats in grouped.values():
        merged = median_row(repeats)
        merged["repeats"] = len(repeats)
        merged["errors"] = sum(r["errors"] for r in repeats)
        out.append(merged)
    return out


def find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()) and row["requests"]:
            return row
    return None


def target(
    name: str,
    value: float,
    limit: float,
    lower_is_better: bool,
    detail: str,
    unit: str = "ratio",
) -> dict[str, Any]:
    """One target's verdict; ``unit`` is "ratio", or "ms" or "us" (a difference)."""
    met = None if math.isnan(value) else (value <= limit if lower_is_better else value >= limit)
    sign = "<=" if lower_is_better else ">="
    suffix = {"ms": " ms", "us": " µs"}.get(unit, "")
    return {
        "target": name,
        "value": value,
        "limit": f"{sign} {limit}{suffix}",
        "met": met,
        "detail": detail,
        "unit": unit,
    }


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
    out += _shm_target(get)
    out += _triton_targets(get)
    return out


# The per-request cost beside real Triton (the same identity model, a Python-backend model.py
# there): appliance system, Triton's, and the floor of the appliance's own stack for it.
TRITON_PAIRS = (
    ("kserve-rest", "triton rest", "floor-uvicorn"),
    ("kserve-grpc", "triton grpc", "floor-grpc-aio"),
)
TRITON_LIMIT = 1.5
# Where the floor alone already costs more than Triton x the limit, the target is the floor + this.
OVER_FLOOR = {"server_cpu_us": 100.0, "p50_ms": 0.1}


def _triton_targets(get: Any) -> list[dict[str, Any]]:
    """Server CPU per request and p50 within 1.5x Triton's (or the floor + 100 µs where the
    floor alone is above that), throughput at least 0.67x; 1 MiB throughput at least 1x."""
    out = []
    for ours_name, peer, floor_name in TRITON_PAIRS:
        for clients in (1, 16):
            for key, what, show in (
                ("server_cpu_us", "server CPU per request", lambda v: f"{_us(v)} µs"),
                ("p50_ms", "p50", _ms),
            ):
                ours, theirs = get(ours_name, "16B", clients, key), get(peer, "16B", clients, key)
                floor = get(floor_name, "16B", clients, key)
                name = f"{clients} client(s), 16 B, {ours_name} {what} vs {peer}"
                detail = f"{show(ours)} vs {show(theirs)}; the floor ({floor_name}) {show(floor)}"
                if None not in (floor, theirs) and floor > TRITON_LIMIT * theirs:
                    over = math.nan if ours is None else ours - floor
                    unit = "us" if key == "server_cpu_us" else "ms"
                    out.append(
                        target(
                            f"{name} (the floor alone is above {TRITON_LIMIT}x: minus the floor)",
                            over,
                            OVER_FLOOR[key],
                            True,
                            detail,
                            unit,
                        )
                    )
                else:
                    out.append(target(name, ratio(ours, theirs), TRITON_LIMIT, True, detail))
            ours_rps, theirs_rps = (
                get(ours_name, "16B", clients, "rps"),
                get(peer, "16B", clients, "rps"),
            )
            out.append(
                target(
                    f"{clients} client(s), 16 B, {ours_name} throughput vs {peer}",
                    ratio(ours_rps, theirs_rps),
                    0.67,
                    False,
                    f"{_rps(ours_rps)} vs {_rps(theirs_rps)} req/s",
                )
            )
    for ours_name, peer, payload, clients in (
        ("kserve-rest", "triton rest", "1MiB", 16),
        ("kserve-shm", "triton shm", "1MiB", 16),
        ("kserve-rest", "triton rest", "16MiB", 4),
        ("kserve-shm", "triton shm", "16MiB", 4),
    ):
        ours_rps, theirs_rps = (
            get(ours_name, payload, clients, "rps"),
            get(peer, payload, clients, "rps"),
        )
        out.append(
            target(
                f"{clients} clients, {payload}, {ours_name} throughput vs {peer}",
                ratio(ours_rps, theirs_rps),
                1.0,
                False,
                f"{_rps(ours_rps)} vs {_rps(theirs_rps)} req/s",
            )
        )
    return out


# Issue 20: the rate of tensor data through KServe system shm on a many-core host.
SHM_TARGET_GBPS = 5.0
SHM_TARGET_CPUS = 8


def _shm_target(get: Any) -> list[dict[str, Any]]:
    rps = get("kserve-shm", "1MiB", 16, "rps")
    gbps = math.nan if rps is None else rps * 2 * (1 << 20) / 1e9
    item = target(
        "16 clients, 1 MiB over KServe system shm, GB/s of tensor data in and out (issue 20)",
        gbps,
        SHM_TARGET_GBPS,
        False,
        f"{_rps(rps)} req/s x 1 MiB in + 1 MiB out",
    )
    cpus = len(os.sched_getaffinity(0))
    if cpus < SHM_TARGET_CPUS and item["met"] is not None:
        item["met"] = None
        item["detail"] += f"; no verdict: the target is for a 16-core host, this one has {cpus}"
    return [item]


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


def _throughput_detail(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """req/s, then CPU per request of each server and of the clients driving it."""
    if a is None or b is None:
        return "not measured"
    return (
        f"{_rps(a['rps'])} vs {_rps(b['rps'])} req/s; server CPU {a['server_cpu_us']:,.0f} vs "
        f"{b['server_cpu_us']:,.0f} µs/req; client CPU {a['client_cpu_us']:,.0f} vs "
        f"{b['client_cpu_us']:,.0f} µs/req"
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f} ms"


def _us(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.0f}"


def _rps(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.0f}"


def print_grid(summary: Summary) -> None:
    print(
        f"\n{'system':<24}{'payload':>8}{'c':>4}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'srv us/req':>11}{'cli us/req':>11}{'errors':>7}"
    )
    for name in SYSTEMS:
        for payload, by_level in summary.get(name, {}).items():
            for concurrency, row in sorted(by_level.items()):
                print(
                    f"{name:<24}{payload:>8}{concurrency:>4}{row['rps']:>9.0f}"
                    f"{row['p50_ms']:>9.3f}{row['p99_ms']:>9.3f}{row['server_cpu_us']:>11.0f}"
                    f"{row['client_cpu_us']:>11.0f}{row['errors']:>7}"
                )


def print_targets(results: list[dict[str, Any]]) -> None:
    print("\ntargets (ratios measured in this run; this machine: 2 vCPUs, noisy):")
    for item in results:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[item["met"]]
        print(f"  {item['target']}: {item['value']:.2f} ({item['limit']}) {verdict}")
        print(f"      {item['detail']}")


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
