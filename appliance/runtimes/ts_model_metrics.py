"""A TorchServe handler's metrics (``context.metrics``), exported on /metrics as TorchServe does.

TorchServe's workers log each metric a handler records, and its frontend, in
``metrics_mode=prometheus``, exports those its metrics config declares
(HandlerTime and PredictionTime by default; every one with
``model_metrics_auto_detect=true``). Here every series a handler records
(and PredictionTime, HandlerTime, recorded where TorchServe's backend
records them) is written into the tree's metric files, of their own types
(``tscounter``, ``tsgauge``, ``tshistogram``), and /metrics shows them as
TorchServe's Java frontend writes them (appliance/observability/metric_files.py):
the name as given; ``# HELP <name> Torchserve prometheus <kind> metric with
unit: <unit>``; the dimensions in the order the handler gave them, then
Hostname; a counter summed over the model's instances, a gauge the last
value any of them set, a histogram in the Java client's default buckets.

A series' label order rides in its help text (the files' keys sort labels):
``<unit>\\t<name>,<name>,...``.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import values

from appliance.observability.metric_files import TORCHSERVE, go_number

# The Prometheus Java client's default histogram buckets.
BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    math.inf,
)
# TorchServe's units, by what a handler passes (ts/metrics/unit.py).
UNITS = {
    "ms": "Milliseconds",
    "s": "Seconds",
    "percent": "Percent",
    "count": "Count",
    "MB": "Megabytes",
    "GB": "Gigabytes",
    "kB": "Kilobytes",
    "B": "Bytes",
    "": "unit",
}
# The model metrics TorchServe's default metrics config declares: their unit is the config's.
DECLARED_UNITS = {"HandlerTime": "ms", "PredictionTime": "ms"}
KINDS = ("counter", "gauge", "histogram")


def unit_name(unit: str | None) -> str:
    """The unit TorchServe writes for what a handler passed (a unit it does not know, as given)."""
    return UNITS.get(unit or "", unit or "unit")


class Series:
    """One series of a handler's metric in this process's metric files.

    Args:
        name: the metric's name.
        kind: "counter", "gauge" or "histogram".
        unit: TorchServe's name of its unit (:func:`unit_name`).
        labels: its dimensions (name, value) in the handler's order, Hostname last.
    """

    def __init__(self, name: str, kind: str, unit: str, labels: Sequence[tuple[str, str]]) -> None:
        self.kind = kind
        shown = DECLARED_UNITS.get(name, unit)
        order = [label for label, _ in labels]
        help_text = f"{shown}\t{','.join(order)}"
        file_type = TORCHSERVE + kind

        def value(sample: str, *extra: tuple[str, str]) -> Any:
            pairs = [*labels, *extra]
            return values.ValueClass(
                file_type,
                name,
                sample,
                [label for label, _ in pairs],
                [text for _, text in pairs],
                help_text,
            )

        if kind == "histogram":
            self._buckets = [value(f"{name}_bucket", ("le", go_number(b))) for b in BUCKETS]
            self._value = value(f"{name}_sum")
        else:
            self._value = value(name)
        self._lock = threading.Lock()

    def record(self, value: float) -> None:
        """Add to a counter, set a gauge, observe a histogram's value."""
        if self.kind == "counter":
            self._value.inc(value)
        elif self.kind == "gauge":
            # Stamped: the scrape shows the last value any instance set.
            self._value.set(value, time.time())
        else:
            with self._lock:
                self._value.inc(value)
                for bound, bucket in zip(BUCKETS, self._buckets, strict=True):
                    if value <= bound:
                        bucket.inc(1)
                        break


class Exported:
    """The series a handler's metrics wrote to, made on first use."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str, tuple[tuple[str, str], ...]], Series] = {}
        self._host = socket.gethostname()

    def record(
        self, name: str, kind: str, unit: str, dimensions: Sequence[tuple[str, str]], value: float
    ) -> None:
        labels = (*dimensions, ("Hostname", self._host))
        key = (name, kind, labels)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Series(name, kind, unit, labels)
        series.record(value)
