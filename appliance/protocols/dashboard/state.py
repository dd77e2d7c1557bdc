"""The dashboard's data: the host's state and cumulative traffic, as JSON.

One document answers everything the page shows. State comes from three
places, all shared by every HTTP worker, so it does not matter which worker
a poll reaches: the status table (online, readiness, instances, worker
counters), the master over the control socket (every process with restarts,
RSS and CPU, uptime, reload state) and the Prometheus multiprocess files
(calls by protocol and model, latency buckets; see ``traffic.py``). Counters
are cumulative; the page turns two readings into rates.
"""

from __future__ import annotations

from typing import Any

from appliance.client import traffic
from appliance.client.api import ModelClient
from appliance.core.status import Counter, Role
from appliance.protocols.page import host_state

# The master answers a status call within milliseconds; a page must not hang
# on a master that is busy, so it shows the status table's view instead.
MASTER_TIMEOUT_S = 2.0


def collect(client: ModelClient) -> dict[str, Any]:
    """Return the whole document the page polls."""
    master = client.master_status(MASTER_TIMEOUT_S)
    return {
        **host_state(client),
        "master": _host(master),
        "models": [_model(client, name) for name in client.models()],
        "unloaded": list(master.get("unloaded", [])) if master else [],
        "processes": _processes(master) if master else _slot_processes(client),
        "traffic": traffic.read(),
        "sizing": master.get("sizing") if master else None,
    }


def _host(master: dict[str, Any] | None) -> dict[str, Any] | None:
    if master is None:
        return None
    keys = ("tree", "pid", "uptime_s", "requests_per_s", "reloading", "ports")
    return {key: master.get(key) for key in keys}


def _model(client: ModelClient, name: str) -> dict[str, Any]:
    counts = client.counters(name)
    ready = client.model_ready(name)
    return {
        "name": name,
        "ready": ready,
        "why": "" if ready else client.router.why_not_ready(name),
        "instances": [_instance(client, slot) for slot in client.router.slots.get(name, ())],
        "success": counts[Counter.SUCCESS],
        "fail": counts[Counter.FAIL],
        "batches": counts[Counter.BATCHES],
        "rows": counts[Counter.BATCH_ROWS],
        "queue_ns": counts[Counter.QUEUE_NS],
        "compute_ns": counts[Counter.COMPUTE_NS],
        "last_inference_ms": counts[Counter.LAST_INFERENCE_MS],
    }


def _instance(client: ModelClient, slot: int) -> dict[str, Any]:
    info = client.status.read(slot)
    return {
        "instance": info.instance,
        "pid": info.pid,
        "state": info.state.name.lower(),
        "depth": info.depth,
    }


def _processes(master: dict[str, Any]) -> list[dict[str, Any]]:
    keys = (
        "pid",
        "role",
        "model",
        "state",
        "restarts",
        "rss_bytes",
        "cpu_percent",
        "device",
        "device_memory_bytes",
    )
    return [{key: process.get(key) for key in keys} for process in master.get("processes", [])]


def _slot_processes(client: ModelClient) -> list[dict[str, Any]]:
    """Every process the status table knows, without the master's figures."""
    processes = []
    for info in client.status.occupied():
        model = info.name if info.role is Role.MODEL else ""
        role = f"model[{model}#{info.instance}]" if model else info.role.name.lower()
        processes.append(
            {
                "pid": info.pid,
                "role": role,
                "model": model,
                "state": info.state.name.lower(),
                "restarts": None,
                "rss_bytes": None,
                "cpu_percent": None,
                "device": info.device or None,
                "device_memory_bytes": info.device_memory if info.device else None,
            }
        )
    return processes
