"""TorchServe's metric families on /metrics, for the models a TorchServe archive gives.

A dashboard built on TorchServe's Prometheus metrics (``metrics_mode=prometheus``)
reads these names and labels unchanged, in the form its Java client writes
them (a comma after the last label, numbers as Java prints doubles):

    ts_inference_requests_total{model_name, model_version, hostname}    counter
    ts_inference_latency_microseconds{model_name, model_version, hostname}  counter
    ts_queue_latency_microseconds{model_name, model_version, hostname}  counter
    Requests2XX, Requests4XX, Requests5XX{Level="Host", Hostname}        counters
    CPUUtilization, MemoryUsed, MemoryAvailable, MemoryUtilization,
    DiskUsage, DiskUtilization, DiskAvailable{Level="Host", Hostname}   gauges

They come from the model instances' counters in the status table: every
request a model answered or failed, its time in the queue and in the model;
``model_version`` is "default", as TorchServe labels a request that named
no version. Written only while a TorchServe model is served.
"""

from __future__ import annotations

import socket

import psutil

from appliance.client.api import ModelClient
from appliance.client.traffic import answered_by_class
from appliance.core.status import Counter
from appliance.observability.metric_files import escape_value

PLATFORM = "torchserve"
# name -> (unit, the counters it sums, scale: ns -> µs for the latencies)
COUNTERS: dict[str, tuple[str, tuple[Counter, ...], float]] = {
    "ts_inference_requests_total": ("Count", (Counter.SUCCESS, Counter.FAIL), 1.0),
    "ts_inference_latency_microseconds": (
        "Microseconds",
        (Counter.QUEUE_NS, Counter.COMPUTE_NS),
        1e-3,
    ),
    "ts_queue_latency_microseconds": ("Microseconds", (Counter.QUEUE_NS,), 1e-3),
}
MIB = 1 << 20
GIB = 1 << 30


def text(client: ModelClient) -> bytes:
    """TorchServe's families as Prometheus text; empty without a TorchServe model."""
    models = [model for model in client.models() if _is_torchserve(client, model)]
    if not models:
        return b""
    host = socket.gethostname()
    counts = {model: client.counters(model) for model in models}
    lines: list[str] = []
    for name, (unit, counters, scale) in COUNTERS.items():
        lines.append(_family(name, "counter", unit))
        for model in models:
            value = sum(counts[model][counter] for counter in counters) * scale
            labels = {"model_name": model, "model_version": "default", "hostname": host}
            lines.append(_sample(name, labels, value))
    for kind, count in answered_by_class(PLATFORM).items():
        name = f"Requests{kind}"
        lines.append(_family(name, "counter", "Count"))
        lines.append(_sample(name, {"Level": "Host", "Hostname": host}, count))
    memory = psutil.virtual_memory()
    disk = psutil.disk_usage("/")
    for name, unit, value in (
        ("CPUUtilization", "Percent", psutil.cpu_percent()),
        ("MemoryUsed", "Megabytes", memory.used / MIB),
        ("MemoryAvailable", "Megabytes", memory.available / MIB),
        ("MemoryUtilization", "Percent", memory.percent),
        ("DiskUsage", "Gigabytes", disk.used / GIB),
        ("DiskUtilization", "Percent", disk.percent),
        ("DiskAvailable", "Gigabytes", disk.free / GIB),
    ):
        lines.append(_family(name, "gauge", unit))
        lines.append(_sample(name, {"Level": "Host", "Hostname": host}, value))
    return "".join(lines).encode()


def _is_torchserve(client: ModelClient, model: str) -> bool:
    try:
        return client.metadata(model).platform == PLATFORM
    except Exception:  # not loaded yet, or failed: it has answered nothing
        return False


def _family(name: str, kind: str, unit: str) -> str:
    return f"# HELP {name} Torchserve prometheus {kind} metric with unit: {unit}\n" + (
        f"# TYPE {name} {kind}\n"
    )


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    pairs = "".join(f'{key}="{escape_value(text)}",' for key, text in labels.items())
    return f"{name}{{{pairs}}} {float(value)!r}\n"
