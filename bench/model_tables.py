"""The report of bench_models.py: medians over rounds, and the tables of its results.

Apart from the runs because the tables read only the recorded results:
one row per point and variant, what reading a host with LARGE models
costs, and a response ring's first touch.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.model_calls import LARGE
from bench.model_folders import point_models


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of every figure a table shows."""
    done = [run for run in runs if "ready_s" in run]
    if not done:
        return {"skipped": (runs[0] if runs else {}).get("skipped", "no run")}
    keys = ("ready_s", "processes_mib", "shm_mib", "all_mib", "worker_uss_mib")
    keys += ("worker_pss_mib", "warm_ms", "load", "metrics_first_ms", "metrics_ms")
    keys += ("metrics_bytes", "dashboard_state_ms", "ctl_status_reply_ms")
    keys += ("ctl_status_command_ms", "ctl_status_lines", "repository_scan_ms")
    summary: dict[str, Any] = {"rounds": len(done)}
    for key in keys:
        values = [run[key] for run in done if run.get(key) is not None]
        summary[key] = statistics.median(values) if values else None
    kinds = {kind for run in done for kind in run["cold_ms"]}
    summary["cold_ms"] = {
        kind: statistics.median(run["cold_ms"][kind] for run in done if kind in run["cold_ms"])
        for kind in sorted(kinds)
    }
    return summary


def table(summaries: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The table: one row per point and variant, medians over rounds."""
    lines = [
        "| models | start | ready s | memory in all MiB | per model MiB | worker USS / PSS MiB "
        "| /dev/shm MiB | cold first request ms | warm ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point, by_variant in summaries.items():
        count = len(point_models(point))
        for variant, row in by_variant.items():
            if "ready_s" not in row:
                lines.append(f"| {point} | {variant} | skipped: {row.get('skipped')} |||||||")
                continue
            base = summaries.get("1", {}).get(variant, {})
            per = (
                (row["all_mib"] - base["all_mib"]) / (count - 1)
                if count > 1 and "all_mib" in base
                else None
            )
            worker = (
                f"{row['worker_uss_mib']:.1f} / {row['worker_pss_mib']:.1f}"
                if row.get("worker_uss_mib") is not None
                else "(one process)"
            )
            cold = ", ".join(f"{kind} {ms:.1f}" for kind, ms in row["cold_ms"].items())
            lines.append(
                f"| {point} | {variant} | {row['ready_s']:.1f} | {row['all_mib']:.0f} | "
                f"{'-' if per is None else f'{per:.1f}'} | {worker} | {row['shm_mib']:.0f} | "
                f"{cold} | {row['warm_ms']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def large_table(summaries: dict[str, dict[str, dict[str, Any]]]) -> str:
    """What reading the state of a host with LARGE models costs, per variant that ran it."""
    names = {
        "metrics_first_ms": "/metrics, a worker's first scrape, ms",
        "metrics_ms": "/metrics, later scrapes, ms",
        "metrics_bytes": "/metrics, bytes",
        "dashboard_state_ms": "dashboard state, ms",
        "ctl_status_reply_ms": "ctl status reply, ms",
        "ctl_status_command_ms": "`appliance ctl status` command, ms",
        "ctl_status_lines": "`appliance ctl status` lines",
        "repository_scan_ms": f"scan of a repository of {LARGE} directories, ms",
    }
    found = [
        (point, variant, row)
        for point, by_variant in summaries.items()
        for variant, row in by_variant.items()
        if row.get("metrics_ms") is not None
    ]
    if not found:
        return ""
    head = " | ".join(f"{point} {variant}" for point, variant, _row in found)
    lines = [f"| with {LARGE} models | {head} |", "|---|" + "---|" * len(found)]
    for key, label in names.items():
        cells = " | ".join(f"{row[key]:,.0f}" for _point, _variant, row in found)
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines) + "\n"


def touch_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| response ring | pre-faulted by the worker | making it ms "
        "| a frontend's first attach ms |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['ring_mib']} MiB | {'yes' if row['prefault'] else 'no'} | "
            f"{row['create_ms']:.2f} | {row['first_attach_ms']:.2f} |"
        )
    return "\n".join(lines) + "\n"
