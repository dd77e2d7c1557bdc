"""What the tree's recorded calls add up to: totals read from the Prometheus multiprocess files.

Every frontend process records each model call (by protocol, model and
outcome, with its latency) into ``PROMETHEUS_MULTIPROC_DIR`` (see
``appliance/observability/metrics.py``). Read together, the files give host-wide totals
that only grow, across frontend and model restarts and reloads: the dashboard
turns two readings into rates and latency quantiles for the interval between
them; the statistics, Triton's metrics and an ensemble's counters read them too.
"""

from __future__ import annotations

import math
from typing import Any

from appliance.errors import ErrorCode
from appliance.observability.metrics import (
    CACHE_LOOKUPS_TOTAL,
    CACHE_SECONDS_TOTAL,
    CALL_SECONDS_BUCKET,
    CALL_SECONDS_COUNT,
    CALL_SECONDS_SUM,
    CALLS_TOTAL,
    FRONTEND_FAMILY,
    FRONTEND_TOTAL,
    OUTCOMES,
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


def cache_totals(model: str) -> dict[str, tuple[int, float]]:
    """``model``'s response cache lookups, every process's: result -> (count, seconds)."""
    totals = {"hit": (0, 0.0), "miss": (0, 0.0)}
    for name, labels, value in call_samples():
        result = labels.get("result", "")
        if labels.get("model") != model or result not in totals:
            continue
        count, seconds = totals[result]
        if name == CACHE_LOOKUPS_TOTAL:
            totals[result] = (count + int(value), seconds)
        elif name == CACHE_SECONDS_TOTAL:
            totals[result] = (count, seconds + value)
    return totals


def call_totals(model: str) -> tuple[int, int, float]:
    """The calls to ``model`` every process of the tree has recorded: (ok, failed, seconds).

    Failed leaves out bad requests (as a model worker's own counters do);
    seconds is the sum of every call's time. It reads every process's
    metrics files, for statistics asked now and then, never per request.
    """
    ok = failed = 0
    seconds = 0.0
    for name, labels, value in call_samples():
        if labels.get("model") != model:
            continue
        if name == CALLS_TOTAL:
            outcome = labels.get("outcome")
            if outcome == "ok":
                ok += int(value)
            elif outcome != OUTCOMES[ErrorCode.BAD_REQUEST]:
                failed += int(value)
        elif name == CALL_SECONDS_SUM:
            seconds += value
    return ok, failed, seconds


def answered_by_class(protocol: str) -> dict[str, int]:
    """The requests ``protocol``'s frontends answered, by status class ("2XX", "4XX",
    "5XX"), every process's (HTTP statuses; other forms of status count in none)."""
    found = {"2XX": 0, "4XX": 0, "5XX": 0}
    for name, labels, value in call_samples((FRONTEND_FAMILY,)):
        status = labels.get("status", "")
        if name == FRONTEND_TOTAL and labels.get("protocol") == protocol and status.isdigit():
            kind = f"{status[0]}XX"
            if kind in found:
                found[kind] += int(value)
    return found


def rejected_calls(model: str) -> int:
    """Calls to ``model`` its queue policy refused (every process's)."""
    rejected = OUTCOMES[ErrorCode.REJECTED]
    return sum(
        int(value)
        for name, labels, value in call_samples()
        if name == CALLS_TOTAL
        and labels.get("model") == model
        and labels.get("outcome") == rejected
    )
