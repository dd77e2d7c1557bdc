"""``ts.metrics.metric_type_enum``: the kinds of a custom metric."""

from __future__ import annotations

import enum


class MetricTypes(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
