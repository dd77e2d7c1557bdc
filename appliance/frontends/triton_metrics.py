"""Triton's metric families on /metrics, beside the appliance's own, from the same counters.

A Grafana dashboard or an alert built on Triton's metrics reads these names
unchanged: per model and version (labels ``model``, ``version``) the
``nv_inference_*`` counters (requests that succeeded and failed, by
Triton's failure reasons; inferences, executions; cumulative request, queue
and compute durations in microseconds) and the pending-request gauge, and
the host's ``nv_cpu_*`` gauges. They come from the model instances'
counters in the status table, the ones the statistics extension reports;
what the appliance does not time apart (compute input and output) is 0, as
Triton reports a step it does not run. A failure is counted as ``BACKEND``
(the model, or its instance, failed); a request refused before it reached a
model (a bad request) counts in neither, as in Triton.
"""

from __future__ import annotations

import psutil

from appliance.client.api import ModelClient
from appliance.client.traffic import cache_totals, rejected_calls
from appliance.core.status import Counter, Role, SlotState
from appliance.observability.metric_files import escape_value, go_number
from appliance.protocols.kserve.service import version_of

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
PENDING = "nv_inference_pending_request_count"
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# name -> (help, the counter it reads, scale: ns -> µs for the durations)
COUNTERS: dict[str, tuple[str, tuple[Counter, ...], float]] = {
    SUCCESS: (
        "Number of successful inference requests, all batch sizes",
        (Counter.SUCCESS,),
        1.0,
    ),
    "nv_inference_count": (
        "Number of inferences performed (does not include cached requests)",
        (Counter.BATCH_ROWS,),
        1.0,
    ),
    "nv_inference_exec_count": (
        "Number of model executions performed (does not include cached requests)",
        (Counter.BATCHES,),
        1.0,
    ),
    "nv_inference_request_duration_us": (
        "Cumulative inference request duration in microseconds (includes cached requests)",
        (Counter.QUEUE_NS, Counter.COMPUTE_NS),
        1e-3,
    ),
    "nv_inference_queue_duration_us": (
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        (Counter.QUEUE_NS,),
        1e-3,
    ),
    "nv_inference_compute_input_duration_us": (
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        (),
        1.0,
    ),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        (Counter.COMPUTE_NS,),
        1e-3,
    ),
    "nv_inference_compute_output_duration_us": (
        "Cumulative inference compute output duration in microseconds (does not include "
        "cached requests)",
        (),
        1.0,
    ),
}


def text(client: ModelClient) -> bytes:
    """Triton's families as Prometheus text, read from the status table now.

    Written here rather than by prometheus_client, which would name every
    counter's samples ``..._total``: Triton's have no suffix, and a dashboard
    queries them by name.
    """
    models = [(model, version_of(client, model)) for model in client.models()]
    counts = {model: client.counters(model) for model, _ in models}
    cached = {model: cache_totals(model) for model, _ in models if client.caches(model)}
    lines: list[str] = []
    for name, (help_text, counters, scale) in COUNTERS.items():
        _family(lines, name, help_text, "counter")
        for model, version in models:
            value = sum(counts[model][counter] for counter in counters) * scale
            if name == SUCCESS and model in cached:
                value += cached[model]["hit"][0]  # a hit is a success too
            lines.append(_sample(name, {"model": model, "version": version}, value))
        if name == SUCCESS:  # Triton's order: failures right after successes
            _failures(lines, models, counts)
    _cache_families(lines, [(m, v) for m, v in models if m in cached], cached)
    _family(
        lines,
        PENDING,
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
    )
    depth = _pending(client, {model for model, _ in models})
    for model, version in models:
        lines.append(_sample(PENDING, {"model": model, "version": version}, depth[model]))
    memory = psutil.virtual_memory()
    for name, help_text, value in (
        ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", psutil.cpu_percent() / 100),
        ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", memory.total),
        ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", memory.used),
    ):
        _family(lines, name, help_text, "gauge")
        lines.append(_sample(name, {}, value))
    return "".join(lines).encode()


CACHE_FAMILIES = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "hit", 0),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        "hit",
        1,
    ),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "miss", 0),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        "miss",
        1,
    ),
)


def _cache_families(
    lines: list[str],
    models: list[tuple[str, str]],
    cached: dict[str, dict[str, tuple[int, float]]],
) -> None:
    """The response cache's families, for the models that use it (client/cache.py)."""
    if not models:
        return
    for name, help_text, result, field in CACHE_FAMILIES:
        _family(lines, name, help_text, "counter")
        for model, version in models:
            value = cached[model][result][field] * (1e6 if field else 1)
            lines.append(_sample(name, {"model": model, "version": version}, int(value)))


def _failures(
    lines: list[str], models: list[tuple[str, str]], counts: dict[str, dict[Counter, int]]
) -> None:
    _family(lines, FAILURE, "Number of failed inference requests, all batch sizes", "counter")
    for model, version in models:
        # A queue policy's refusals are the worker's failures too: told apart here.
        rejected = rejected_calls(model)
        by_reason = {
            "REJECTED": rejected,
            "BACKEND": max(counts[model][Counter.FAIL] - rejected, 0),
        }
        for reason in FAILURE_REASONS:
            labels = {"model": model, "reason": reason, "version": version}
            lines.append(_sample(FAILURE, labels, by_reason.get(reason, 0)))


def _family(lines: list[str], name: str, help_text: str, kind: str) -> None:
    lines.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    pairs = ",".join(f'{key}="{escape_value(text)}"' for key, text in labels.items())
    number = go_number(float(value))
    return f"{name}{{{pairs}}} {number}\n" if pairs else f"{name} {number}\n"


def _pending(client: ModelClient, models: set[str]) -> dict[str, int]:
    depth = dict.fromkeys(models, 0)
    for info in client.status.occupied():
        if info.role is Role.MODEL and info.state is SlotState.READY and info.name in depth:
            depth[info.name] += info.depth
    return depth
