"""Prometheus metrics, added up across every process of the tree.

Each process records into prometheus_client's multiprocess files under
``<tree dir>/metrics``: the master sets ``PROMETHEUS_MULTIPROC_DIR`` for its
children before they start, and the library picks it up at import. GET
/metrics on the HTTP port adds the files up (counters survive restarts),
together with gauges read at scrape time from the status table and the
master (see ``frontends/metrics.py``). A process started without the
variable (a test, a benchmark) records in memory only.

Frontends say which protocol a request came in by (:data:`PROTOCOL`, set
per request); the client API records every model call under that label, and
notes the model in :data:`MODEL` for the access log line.
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any

from prometheus_client import Counter, Histogram

from appliance.errors import ErrorCode

PROTOCOL: contextvars.ContextVar[str] = contextvars.ContextVar("protocol", default="internal")
MODEL: contextvars.ContextVar[str] = contextvars.ContextVar("model", default="")

_SECONDS = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
    *(0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

REQUESTS = Counter(
    "appliance_model_requests",
    "Calls to models, by protocol, model and outcome (ok or the error kind).",
    ["protocol", "model", "outcome"],
)
LATENCY = Histogram(
    "appliance_model_request_duration_seconds",
    "Time from a frontend sending a request to a model until the reply.",
    ["protocol", "model"],
    buckets=_SECONDS,
)
BATCH_ROWS = Histogram(
    "appliance_batch_rows",
    "Rows per batch a model instance ran.",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
QUEUE = Histogram(
    "appliance_queue_duration_seconds",
    "Time requests waited in a model instance's queue.",
    ["model"],
    buckets=_SECONDS,
)
COMPUTE = Histogram(
    "appliance_compute_duration_seconds",
    "Time a model spent on one batch.",
    ["model"],
    buckets=_SECONDS,
)
FRONTEND = Counter(
    "appliance_frontend_requests",
    "Requests answered by the frontends, by protocol and wire status.",
    ["protocol", "status"],
)

access_log = logging.getLogger("appliance.access")
_OUTCOMES = {code: code.name.lower() for code in ErrorCode}
_OUTCOMES[ErrorCode.OK] = "ok"


# PERF: looking up a labelled child costs as much as recording into it, so
# each process keeps the children it has used.
_CALLS: dict[tuple[str, str, ErrorCode], tuple[Any, Any]] = {}
_BATCHES: dict[str, tuple[Any, Any, Any]] = {}


def record_call(model: str, code: ErrorCode, started: float) -> None:
    """Count one model call; ``started`` is its time.perf_counter()."""
    protocol = PROTOCOL.get()
    # An unknown model's name comes from the client: never a label value,
    # or any caller could grow the metrics without bound.
    label = "" if code is ErrorCode.MODEL_NOT_FOUND else model
    MODEL.set(label)
    key = (protocol, label, code)
    children = _CALLS.get(key)
    if children is None:
        children = (
            REQUESTS.labels(protocol, label, _OUTCOMES[code]),
            LATENCY.labels(protocol, label),
        )
        _CALLS[key] = children
    children[0].inc()
    children[1].observe(time.perf_counter() - started)


def record_batch(model: str, rows: int, waits_s: list[float], compute_s: float) -> None:
    """Count one batch a model worker ran."""
    children = _BATCHES.get(model)
    if children is None:
        children = (BATCH_ROWS.labels(model), QUEUE.labels(model), COMPUTE.labels(model))
        _BATCHES[model] = children
    rows_child, queue, compute = children
    rows_child.observe(rows)
    for wait in waits_s:
        queue.observe(wait)
    compute.observe(compute_s)


def log_access(protocol: str, status: str, started: float, detail: str = "") -> None:
    """Count a frontend request and write its access line (INFO, if enabled).

    The record carries its fields as ``access`` too, for JSON lines
    (``server.access_log = "json"``, see ``logs.JsonLines``).
    """
    FRONTEND.labels(protocol, status).inc()
    if access_log.isEnabledFor(logging.INFO):
        model = MODEL.get()
        latency_ms = (time.perf_counter() - started) * 1000
        fields = {
            "protocol": protocol,
            "model": model or None,
            "status": status,
            "latency_ms": round(latency_ms, 3),
            "request": detail or None,
        }
        access_log.info(
            "%s model=%s status=%s latency_ms=%.2f%s",
            protocol,
            model or "-",
            status,
            latency_ms,
            f" {detail}" if detail else "",
            extra={"access": fields},
        )
