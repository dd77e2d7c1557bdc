"""Render ``appliance ctl status`` replies as a table for people."""

from __future__ import annotations

from collections import Counter
from typing import Any

from appliance.core.segment import mib

_COLUMNS = ("pid", "role", "model", "state", "restarts", "rss", "cpu", "device")
# Past this many model processes, ready ones are counted rather than listed:
# two hundred rows would bury the one that failed.
SUMMARY_ABOVE = 24


def format_status(reply: dict[str, Any], every: bool = False) -> str:
    """Return a header line and one row per process.

    With more than SUMMARY_ABOVE model processes, and ``every`` False, the
    ready model processes are counted by state instead of listed; the others
    (starting, dead, failed) are still listed.
    """
    online = "online" if reply.get("online") else "offline"
    ready = "ready" if reply.get("ready") else "not ready"
    draining = ", draining" if reply.get("draining") else ""
    ports = reply.get("ports", {})
    lines = [
        f"appliance tree {reply.get('tree')} (master pid {reply.get('pid')}): {online}, "
        f"{ready}{draining}; up {reply.get('uptime_s', 0):.0f} s; "
        f"{reply.get('requests_per_s', 0):.1f} requests/s; "
        + ", ".join(f"{name} {port}" for name, port in ports.items()),
        "",
    ]
    rows = [_COLUMNS]
    processes = list(reply.get("processes", []))
    models = [process for process in processes if process.get("model")]
    summary = ""
    if not every and len(models) > SUMMARY_ABOVE:
        states = Counter(str(process.get("state", "")) for process in models)
        summary = f"{len(models)} model processes: " + ", ".join(
            f"{count} {state}" for state, count in states.most_common()
        )
        summary += "; the ready ones are not listed (appliance ctl status --all lists them)"
        processes = [p for p in processes if not p.get("model") or p.get("state") != "ready"]
    for process in processes:
        rows.append(
            (
                str(process.get("pid") or "-"),
                str(process.get("role", "")),
                str(process.get("model") or "-"),
                str(process.get("state", "")),
                str(process.get("restarts", 0)),
                _megabytes(process.get("rss_bytes")),
                _percent(process.get("cpu_percent")),
                _device(process),
            )
        )
    widths = [max(len(row[index]) for row in rows) for index in range(len(_COLUMNS))]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    if summary:
        lines += ["", summary]
    notes = [p for p in processes if p.get("note")]
    for process in notes:
        lines.append(f"{process['role']}: {process['note']}")
    if reply.get("ensembles"):
        lines += ["", *format_ensembles(reply["ensembles"])]
    if reply.get("sizing"):
        lines += ["", format_sizing(reply["sizing"])]
    if reply.get("shm"):
        lines.append(format_shm(reply["shm"]))
    return "\n".join(lines) + "\n"


def format_shm(shm: dict[str, int]) -> str:
    """One line: /dev/shm's size and free space, the tree's part, any cap on rings."""
    line = (
        f"shared memory: /dev/shm {mib(shm['total_bytes'])}, {mib(shm['free_bytes'])} free; "
        f"this appliance holds {mib(shm['tree_bytes'])}"
    )
    if shm.get("ring_cap_bytes"):
        line += (
            f"; every ring capped at {mib(shm['ring_cap_bytes'])}: /dev/shm was too small "
            f"for the configured {mib(shm['wanted_bytes'])}"
        )
    return line


def format_ensembles(ensembles: list[dict[str, Any]]) -> list[str]:
    """A line per ensemble (no process of its own): its steps, and ready or why not."""
    width = max(len(str(item.get("name", ""))) for item in ensembles)
    lines = []
    for item in ensembles:
        steps = " -> ".join(map(str, item.get("steps", ())))
        state = "ready" if item.get("ready") else f"not ready: {item.get('not_ready')}"
        lines.append(f"ensemble {str(item.get('name')).ljust(width)}  {state}  (steps: {steps})")
    return lines


def format_sizing(sizing: dict[str, Any]) -> str:
    """One line: each process count, marked where "auto" chose it for the CPUs."""
    auto = set(sizing.get("auto", ()))
    counts = ", ".join(
        f"{name} {count}" + (" (auto)" if name in auto else "")
        for name, count in sizing.get("counts", {}).items()
    )
    return f"sized for {sizing.get('cpus')} CPUs: {counts}"


def _megabytes(value: Any) -> str:
    return "-" if value is None else f"{value / 1e6:.1f} MB"


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value:.1f} %"


def _device(process: dict[str, Any]) -> str:
    device = process.get("device")
    if not device:
        return "-"
    memory = process.get("device_memory_bytes")
    return f"{device} ({_megabytes(memory)})" if device.startswith("cuda") and memory else device
