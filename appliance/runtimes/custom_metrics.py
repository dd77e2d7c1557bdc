"""A Triton Python model's own metrics (``pb_utils.MetricFamily``), exported on /metrics.

``MetricFamily(name, description, kind)`` and its ``Metric(labels)`` write
into the tree's metric files, as every process of the appliance does
(prometheus_client's multiprocess files): the /metrics endpoint of each HTTP
worker merges them (appliance/observability/metric_files.py) and shows them as Triton
shows them, by the family's own name (a counter without the ``_total``
prometheus_client adds), its description and type, with the metric's
labels. A counter and a histogram sum over the model's instances; a gauge
too (each instance's last value), and an instance's gauges go when it
stops.

The files are of their own types (``tritoncounter``, ``tritongauge``,
``tritonhistogram``), so that the appliance's metrics keep theirs.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import values

from appliance.observability.metric_files import go_number

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
FILE_TYPE_PREFIX = "triton"

_families: dict[str, tuple[int, str]] = {}
_lock = threading.Lock()


class MetricError(ValueError):
    """A family or metric used in a way Triton refuses (pb_utils raises its exception)."""


def family(name: str, description: str, kind: int) -> None:
    """Declare a family; declaring one again is fine if it says the same.

    Raises:
        MetricError: a bad name or kind, or a family of that name of another kind.
    """
    if kind not in KINDS:
        raise MetricError(f"MetricFamily {name!r}: kind must be COUNTER, GAUGE or HISTOGRAM")
    if not name or not (name[0].isalpha() or name[0] in "_:"):
        raise MetricError(f"MetricFamily name {name!r}: not a Prometheus metric name")
    if not all(c.isalnum() or c in "_:" for c in name):
        raise MetricError(f"MetricFamily name {name!r}: not a Prometheus metric name")
    with _lock:
        known = _families.setdefault(name, (kind, description))
    if known[0] != kind:
        raise MetricError(
            f"MetricFamily {name!r} is a {KINDS[known[0]]} already; it cannot be a {KINDS[kind]}"
        )


class Metric:
    """One labelled series of a family."""

    def __init__(
        self,
        name: str,
        kind: int,
        description: str,
        labels: Mapping[str, str] | None,
        buckets: Sequence[float] | None,
    ) -> None:
        self.name = name
        self.kind = kind
        names = sorted(labels or {})
        label_values = [str((labels or {})[key]) for key in names]
        file_type = FILE_TYPE_PREFIX + KINDS[kind]

        def value(sample: str, *extra: tuple[str, str]) -> Any:
            return values.ValueClass(
                file_type,
                name,
                sample,
                [*names, *(k for k, _ in extra)],
                [*label_values, *(v for _, v in extra)],
                description,
            )

        if kind == HISTOGRAM:
            if not buckets:
                raise MetricError(f"histogram {name!r}: a Metric needs its buckets")
            bounds = sorted(float(b) for b in buckets)
            if bounds[-1] != math.inf:
                bounds.append(math.inf)
            self.bounds = bounds
            self._buckets = [value(f"{name}_bucket", ("le", go_number(b))) for b in bounds]
            self._sum = value(f"{name}_sum")
        else:
            if buckets:
                raise MetricError(f"{KINDS[kind]} {name!r}: only a histogram has buckets")
            self._value = value(name)
        self._lock = threading.Lock()

    def increment(self, by: float) -> None:
        if self.kind == HISTOGRAM:
            raise MetricError(f"histogram {self.name!r}: observe a value, do not increment")
        if self.kind == COUNTER and by < 0:
            raise MetricError(f"counter {self.name!r}: cannot increment by {by} (< 0)")
        self._value.inc(by)

    def set(self, value: float) -> None:
        if self.kind != GAUGE:
            raise MetricError(f"{KINDS[self.kind]} {self.name!r}: only a gauge is set")
        self._value.set(value)

    def observe(self, value: float) -> None:
        if self.kind != HISTOGRAM:
            raise MetricError(f"{KINDS[self.kind]} {self.name!r}: only a histogram observes")
        with self._lock:
            self._sum.inc(value)
            for bound, bucket in zip(self.bounds, self._buckets, strict=True):
                if value <= bound:
                    bucket.inc(1)
                    break

    def value(self) -> float:
        """This instance's value (a histogram: the sum of what it observed)."""
        if self.kind == HISTOGRAM:
            return float(self._sum.get())
        return float(self._value.get())


def close() -> None:
    """Remove this process's gauges: what a stopped instance set no longer holds."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        path = Path(directory) / f"{FILE_TYPE_PREFIX}{KINDS[GAUGE]}_{os.getpid()}.db"
        path.unlink(missing_ok=True)
