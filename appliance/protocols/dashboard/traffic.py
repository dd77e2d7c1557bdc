"""Cumulative model calls and latency from the Prometheus multiprocess files.

Every frontend process records each model call (by protocol, model and
outcome, with its latency) into ``PROMETHEUS_MULTIPROC_DIR`` (see
``appliance/observability/metrics.py``). Read together, the files give host-wide totals
that only grow, across frontend and model restarts and reloads, so the page
can turn two readings into rates and latency quantiles for the interval
between them.
"""

from __future__ import annotations

import math
from typing import Any

from appliance.observability.metrics import (
    CALL_SECONDS_BUCKET,
    CALL_SECONDS_COUNT,
    CALL_SECONDS_SUM,
    CALLS_TOTAL,
    call_samples,
)

# A call whose model is unknown is recorded with an empty model label.
UNKNOWN_MODEL = "(unknown)"


def read() -> dict[str, Any]:
    """Return host-wide call totals by model and protocol, with latency buckets.

    ``bounds`` are the latency buckets' upper bounds in seconds (None for the
    last, unbounded one); each model's ``buckets`` counts calls at or below
    each bound, cumulatively, as Prometheus does.
    """
    models: dict[str, dict[str, Any]] = {}
    protocols: dict[str, float] = {}
    bounds: dict[float, None] = {}
    for name, labels, value in call_samples():
        model = labels.get("model") or UNKNOWN_MODEL
        if name == CALLS_TOTAL:
            entry = _entry(models, model)
            entry["ok" if labels.get("outcome") == "ok" else "fail"] += value
            protocol = labels.get("protocol", "")
            protocols[protocol] = protocols.get(protocol, 0.0) + value
        elif name == CALL_SECONDS_BUCKET:
            bound = float(labels["le"])
            bounds[bound] = None
            buckets = _entry(models, model)["by_bound"]
            buckets[bound] = buckets.get(bound, 0.0) + value
        elif name in (CALL_SECONDS_SUM, CALL_SECONDS_COUNT):
            key = "seconds" if name == CALL_SECONDS_SUM else "count"
            _entry(models, model)[key] += value
    ordered = sorted(bounds)
    for entry in models.values():
        by_bound = entry.pop("by_bound")
        entry["buckets"] = [by_bound.get(bound, 0.0) for bound in ordered]
    return {
        "bounds": [bound if math.isfinite(bound) else None for bound in ordered],
        "models": models,
        "protocols": protocols,
    }


def _entry(models: dict[str, dict[str, Any]], model: str) -> dict[str, Any]:
    entry = models.get(model)
    if entry is None:
        entry = {"ok": 0.0, "fail": 0.0, "seconds": 0.0, "count": 0.0, "by_bound": {}}
        models[model] = entry
    return entry
