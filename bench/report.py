"""bench_peers.py's numbers: medians, appliance/peer ratios, how targets are written.

Everything here reads the run's record (rows of every repeat) and returns
plain data; bench/targets.py and bench/triton_targets.py compute the issues'
targets from it, bench/doc_tables.py turns it into markdown.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from bench.loadgen import median_row
from bench.plan import PEERS, SYSTEMS

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


def throughput_detail(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    """req/s, then CPU per request of each server and of the clients driving it."""
    if a is None or b is None:
        return "not measured"
    return (
        f"{rps(a['rps'])} vs {rps(b['rps'])} req/s; server CPU {a['server_cpu_us']:,.0f} vs "
        f"{b['server_cpu_us']:,.0f} µs/req; client CPU {a['client_cpu_us']:,.0f} vs "
        f"{b['client_cpu_us']:,.0f} µs/req"
    )


def ms(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f} ms"


def us(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.0f}"


def rps(value: float | None) -> str:
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
        verdict = {True: "met", False: "MISSED", None: unjudged(item)}[item["met"]]
        print(f"  {item['target']}: {item['value']:.2f} ({item['limit']}) {verdict}")
        print(f"      {item['detail']}")


def unjudged(item: dict[str, Any]) -> str:
    """What a target without a verdict says: nothing measured, or a value judged
    elsewhere (another host, more rounds; its detail says why)."""
    value = item["value"]
    return "not measured" if value is None or math.isnan(value) else "no verdict"
