"""GET /metrics: Prometheus text for the whole tree, from any HTTP worker.

Counters and histograms come from every process's multiprocess files (see
``appliance/observability/metrics.py``), merged by
``appliance/observability/metric_files.py``. Gauges are read at scrape
time: readiness, queue depths and ring occupancy from the status table, and
restarts, RSS and CPU of every process from the master (one
control-socket call per scrape). Triton's families (``nv_inference_*``,
``nv_cpu_*``) come beside them from the same counters (triton_metrics.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import falcon
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from appliance.client.api import ModelClient
from appliance.core.segment import Space, held_by
from appliance.core.status import Role, SlotState
from appliance.core.tree import PREFIX
from appliance.frontends import torchserve_metrics, triton_metrics
from appliance.observability.metric_files import MetricFiles
from appliance.protocols.web import blocking


class TreeCollector(Collector):
    """Gauges of the tree's state, read when scraped."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        client = self.client
        yield _gauge(
            "appliance_online", "1 while the host is online.", [], [([], client.status.online)]
        )
        yield _gauge(
            "appliance_ready",
            "1 while online and every model is ready.",
            [],
            [([], client.server_ready())],
        )
        ready = [([model], client.model_ready(model)) for model in client.models()]
        yield _gauge(
            "appliance_model_ready", "1 while a model has a ready instance.", ["model"], ready
        )
        yield from self._slots()
        yield from self._processes()
        yield from self._shm()

    def _shm(self) -> Iterator[Metric]:
        space = Space.now()
        yield _gauge(
            "appliance_shm_bytes",
            "The shared-memory filesystem (/dev/shm): its size, what is free, what this "
            "appliance holds there, and the cap on each ring (0: none; see appliance ctl status).",
            ["kind"],
            [
                (["size"], space.total),
                (["free"], space.free),
                (["held"], held_by(f"{PREFIX}{self.client.tree.id}-")),
                (["ring_cap"], self.client.status.ring_cap),
            ],
        )

    def _slots(self) -> Iterator[Metric]:
        status = self.client.status
        depth = GaugeMetricFamily(
            "appliance_queue_depth",
            "Requests queued or running in a model instance, or in flight in a frontend.",
            labels=["role", "model", "instance", "pid"],
        )
        ring = GaugeMetricFamily(
            "appliance_ring_used_bytes",
            "Bytes in use in a process's shared-memory ring (spilled: in one-off segments).",
            labels=["role", "model", "pid", "kind"],
        )
        for info in status.occupied():
            if info.state not in (SlotState.READY, SlotState.STOPPING):
                continue
            role = info.role.name.lower()
            model = info.name if info.role is Role.MODEL else ""
            depth.add_metric([role, model, str(info.instance), str(info.pid)], info.depth)
            used, capacity, spilled = info.ring
            if capacity:
                ring.add_metric([role, model, str(info.pid), "used"], used)
                ring.add_metric([role, model, str(info.pid), "capacity"], capacity)
                ring.add_metric([role, model, str(info.pid), "spilled"], spilled)
        yield depth
        yield ring

    def _processes(self) -> Iterator[Metric]:
        reply = self.client.master_status()
        if reply is None:
            return
        labels = ["role", "model", "pid"]
        restarts = CounterMetricFamily(
            "appliance_process_restarts", "Restarts of a child process.", labels=["role", "model"]
        )
        rss = GaugeMetricFamily("appliance_process_resident_memory_bytes", "RSS.", labels=labels)
        cpu = GaugeMetricFamily("appliance_process_cpu_percent", "CPU use.", labels=labels)
        gpu = GaugeMetricFamily(
            "appliance_model_device_memory_bytes",
            "GPU memory torch has allocated, per model instance on a GPU.",
            labels=[*labels, "device"],
        )
        for process in reply.get("processes", []):
            key = [str(process.get("role", "")), str(process.get("model") or "")]
            restarts.add_metric(key, float(process.get("restarts") or 0))
            if process.get("rss_bytes") is not None:
                rss.add_metric([*key, str(process["pid"])], float(process["rss_bytes"]))
                cpu.add_metric([*key, str(process["pid"])], float(process["cpu_percent"] or 0.0))
            device = str(process.get("device") or "")
            if device.startswith("cuda"):
                memory = float(process.get("device_memory_bytes") or 0)
                gpu.add_metric([*key, str(process["pid"]), device], memory)
        yield restarts
        yield rss
        yield cpu
        yield gpu


def _gauge(name: str, text: str, labels: list[str], values: list[tuple[list[str], Any]]) -> Metric:
    family = GaugeMetricFamily(name, text, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, float(value))
    return family


class MetricsResource:
    """GET /metrics in Prometheus text format."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self.files = MetricFiles(directory) if directory else None

    @blocking  # reads every process's metrics files, and asks the master
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        registry = CollectorRegistry()
        counted = b""
        if self.files is not None:
            counted, others = self.files.text()
            if others is not None:
                registry.register(others)
        registry.register(TreeCollector(self.client))
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = (
            counted
            + triton_metrics.text(self.client)
            + torchserve_metrics.text(self.client)
            + generate_latest(registry)
        )
