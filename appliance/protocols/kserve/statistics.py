"""Triton's statistics extension: each served model's counters in Triton's shape.

The dicts returned are the REST body's ``model_stats``; ``grpc`` parses them
into the protobuf messages. Apart from ``service`` because mapping the
appliance's counters and the response cache's totals onto Triton's
durations is a job of its own.
"""

from __future__ import annotations

from typing import Any

from appliance.client.api import ModelClient
from appliance.client.traffic import cache_totals
from appliance.core.status import Counter
from appliance.errors import ModelNotFound
from appliance.protocols.kserve.service import resolve, version_of

_STAT_KEYS = ("compute_input", "compute_output", "cache_hit", "cache_miss")


def model_statistics(client: ModelClient, model: str, version: str) -> list[dict[str, Any]]:
    """Return one statistics entry per model asked for (every model when "")."""
    if model:
        if model not in client.models():
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        names = [resolve(client, model, version)[0] if version else model]
    else:
        names = client.models()
    return [_statistics(client, name) for name in names]


def _statistics(client: ModelClient, model: str) -> dict[str, Any]:
    counts = client.counters(model)
    success, queue_ns, compute_ns = (
        counts[Counter.SUCCESS],
        counts[Counter.QUEUE_NS],
        counts[Counter.COMPUTE_NS],
    )
    stats = {
        "success": {"count": success, "ns": queue_ns + compute_ns},
        "fail": {"count": counts[Counter.FAIL], "ns": 0},
        "queue": {"count": success, "ns": queue_ns},
        "compute_infer": {"count": success, "ns": compute_ns},
    }
    for key in _STAT_KEYS:
        stats[key] = {"count": success if key.startswith("compute") else 0, "ns": 0}
    if client.caches(model):
        # A hit is a success that never reached the model (Triton counts it so).
        cached = cache_totals(model)
        for result in ("hit", "miss"):
            count, seconds = cached[result]
            stats[f"cache_{result}"] = {"count": count, "ns": int(seconds * 1e9)}
        hits, hit_ns = stats["cache_hit"]["count"], stats["cache_hit"]["ns"]
        for key in ("success", "queue"):
            stats[key] = {"count": stats[key]["count"] + hits, "ns": stats[key]["ns"]}
        stats["success"]["ns"] += hit_ns
    return {
        "name": model,
        "version": version_of(client, model),
        "last_inference": counts[Counter.LAST_INFERENCE_MS],
        "inference_count": counts[Counter.BATCH_ROWS],
        "execution_count": counts[Counter.BATCHES],
        "inference_stats": stats,
        "batch_stats": [],
    }
