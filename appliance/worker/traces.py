"""A model worker's spans of traced requests: queue, compute (linked to its batch), reply.

A request whose descriptor carries ``"trace"`` (the frontend's ``infer``
span, see appliance/observability/tracing.py) gets three spans under that one. A batch
gets one span of its own, linked from each traced request's ``compute``
span and linking back to each: a batch serves many traces at once, so it
belongs to none of them. Requests that are not traced cost a dict lookup.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from appliance.observability import tracing
from appliance.worker.pending import Pending


@dataclass(slots=True)
class Traced:
    """What a worker keeps of a traced request: its parent and its times."""

    traceparent: str
    arrived_ns: int
    computed_ns: int = 0


def accepted(pending: Pending) -> None:
    """Note a traced request's arrival."""
    traceparent = pending.message.body.get("trace")
    if isinstance(traceparent, str) and traceparent:
        pending.trace = Traced(traceparent, time.time_ns())


def batch_ran(model: str, batch: Sequence[Pending], began_ns: int, ended_ns: int) -> None:
    """Record the queue and compute spans of a batch's traced requests, and the batch's span."""
    traced = [p for p in batch if p.trace is not None]
    if not traced or tracing.tracer() is None:
        return
    with contextlib.suppress(Exception):
        from opentelemetry.trace import Link

        parents = [tracing.context_of(p.trace.traceparent) for p in traced]
        links = [Link(_span_context(parent)) for parent in parents]
        rows = sum(max(p.rows, 1) for p in batch)
        whole = tracing.tracer().start_span(
            f"batch {model}",
            start_time=began_ns,
            links=links,
            attributes={"appliance.model": model, "appliance.batch_rows": rows},
        )
        whole.end(end_time=ended_ns)
        to_batch = [Link(whole.get_span_context())]
        for pending, parent in zip(traced, parents, strict=True):
            trace = pending.trace
            tracing.span_at("queue", parent, trace.arrived_ns, began_ns)
            span = tracing.tracer().start_span(
                "compute", context=parent, start_time=began_ns, links=to_batch
            )
            span.end(end_time=ended_ns)
            trace.computed_ns = ended_ns


def replied(pending: Pending) -> None:
    """Record a traced request's reply span, from its compute's end to now."""
    trace = pending.trace
    if trace is None or tracing.tracer() is None:
        return
    with contextlib.suppress(Exception):
        start = trace.computed_ns or trace.arrived_ns
        tracing.span_at("reply", tracing.context_of(trace.traceparent), start, time.time_ns())
    pending.trace = None


def _span_context(context: Any) -> Any:
    from opentelemetry import trace

    return trace.get_current_span(context).get_span_context()
