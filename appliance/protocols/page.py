"""The human-readable page at GET / (browsers), and GRPS's monitor data.

SPEC: grps.md "Metrics接口" — GRPS serves a metrics page at the root of its
HTTP port. GET / from a browser (GraphPipe's route asks :func:`wants_html`)
shows the live dashboard, which the HTTP frontend hands to that route:
processes, models and instances, online/offline, throughput and latency
charts. :func:`snapshot` is the smaller JSON GRPS keeps under
:data:`MONITOR_PATH`.
"""

from __future__ import annotations

import time
from typing import Any

from appliance.client.api import ModelClient
from appliance.core.status import Counter, Role

# Served by the GRPS routes (GRPS keeps its monitor data under /grps/v1/monitor).
MONITOR_PATH = "/grps/v1/monitor/metrics"


def wants_html(accept: str | None) -> bool:
    """Return True when a client (a browser) asks for HTML."""
    return bool(accept) and "text/html" in (accept or "")


def host_state(client: ModelClient) -> dict[str, Any]:
    """The host's state now: the time, online, draining and ready."""
    status = client.status
    return {
        "time_ms": int(time.time() * 1000),
        "online": status.online,
        "draining": status.draining,
        "ready": client.server_ready(),
    }


def snapshot(client: ModelClient) -> dict[str, Any]:
    """Return the host's state and cumulative counters (GRPS's monitor data)."""
    return {
        **host_state(client),
        "models": [_model(client, name) for name in client.models()],
        "processes": _processes(client),
    }


def _model(client: ModelClient, name: str) -> dict[str, Any]:
    counts = client.counters(name)
    return {
        "name": name,
        "ready": client.model_ready(name),
        "instances": len(client.router.slots.get(name, ())),
        "success": counts[Counter.SUCCESS],
        "fail": counts[Counter.FAIL],
        "batches": counts[Counter.BATCHES],
        "queue_ns": counts[Counter.QUEUE_NS],
        "compute_ns": counts[Counter.COMPUTE_NS],
        "last_inference_ms": counts[Counter.LAST_INFERENCE_MS],
    }


def _processes(client: ModelClient) -> list[dict[str, Any]]:
    processes = []
    for info in client.status.occupied():
        label = f"{info.name}#{info.instance}" if info.role is Role.MODEL else ""
        processes.append(
            {
                "role": info.role.name.lower(),
                "name": label,
                "pid": info.pid,
                "state": info.state.name.lower(),
                "depth": info.depth,
            }
        )
    return processes
