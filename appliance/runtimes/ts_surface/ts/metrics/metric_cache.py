"""The ``context.metrics`` of a handler: TorchServe's metric cache, kept in the worker.

The methods are TorchServe's (add_metric, add_counter, add_time, add_size,
add_percent, add_error, get_metric, add_metric_to_cache) with its default
dimensions (ModelName, Level) and units. Each update is logged as the
TorchServe worker logs it (``[METRICS]name.Unit:value|#dims|#type:KIND|#hostname:...``),
kept, and exported on /metrics as TorchServe's prometheus mode shows it
(appliance/runtimes/ts_model_metrics.py).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from appliance.runtimes.ts_model_metrics import Exported, unit_name

from .dimension import Dimension
from .metric_type_enum import MetricTypes

logger = logging.getLogger("ts.metrics")
# Every model's metrics in this process go to /metrics through one set of series.
_exported = Exported()
TIME_UNITS = ("ms", "s")
SIZE_UNITS = ("MB", "kB", "GB", "B")


class CachingMetric:
    """One metric: its unit, dimension names and kind; a value per dimension values."""

    def __init__(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        self.metric_name = metric_name
        self.unit = unit_name(unit)
        self.dimension_names = list(dimension_names or [])
        self.metric_type = metric_type
        self.series: dict[tuple[str, ...], float] = {}

    def add_or_update(
        self, value: float, dimension_values: list[str] | None = None, request_id: str = ""
    ) -> None:
        values = tuple(str(v) for v in dimension_values or [])
        if len(values) != len(self.dimension_names):
            raise ValueError(
                f"metric {self.metric_name}: {len(values)} dimension values for "
                f"{len(self.dimension_names)} dimension names {self.dimension_names}"
            )
        if self.metric_type is MetricTypes.COUNTER:
            if value < 0:
                raise ValueError(f"counter {self.metric_name}: a negative increment {value}")
            self.series[values] = self.series.get(values, 0.0) + value
        else:
            self.series[values] = value
        pairs = list(zip(self.dimension_names, values, strict=True))
        dims = ",".join(f"{n}:{v}" for n, v in pairs)
        line = (
            f"[METRICS]{self.metric_name}.{self.unit}:{value}|#{dims}|"
            f"#type:{self.metric_type.name}|#hostname:{socket.gethostname()},{int(time.time())}"
        )
        logger.info(f"{line},{request_id}" if request_id else line)
        _exported.record(self.metric_name, self.metric_type.value, self.unit, pairs, value)

    def update(
        self, value: float, request_id: str = "", dimensions: list[Dimension] | None = None
    ) -> None:
        self.add_or_update(value, [d.value for d in dimensions or []], request_id)


class MetricsCache:
    """What ``context.metrics`` offers a handler."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.request_ids: dict[int, str] | None = None
        self.cache: dict[tuple[str, MetricTypes], CachingMetric] = {}

    def set_request_ids(self, request_ids: Any) -> None:
        self.request_ids = request_ids

    def _get_req(self, idx: Any) -> str:
        if self.request_ids is None:
            return ""
        if idx is None:
            return ",".join(self.request_ids.values())
        return self.request_ids[idx]

    def _dims(self, dimensions: list[Dimension] | None) -> list[Dimension]:
        found = list(dimensions or [])
        names = [d.name for d in found]
        if "ModelName" not in names:
            found.append(Dimension("ModelName", self.model_name))
        if "Level" not in names:
            found.append(Dimension("Level", "Model"))
        return found

    def _record(
        self,
        name: str,
        value: float,
        unit: str,
        idx: Any,
        dimensions: list[Dimension] | None,
        metric_type: MetricTypes,
    ) -> None:
        request_id = self._get_req(idx)
        dims = self._dims(dimensions)
        metric = self._get_or_add_metric(name, unit, dims, metric_type)
        metric.add_or_update(value, [d.value for d in dims], request_id)

    def _get_or_add_metric(
        self, name: str, unit: str, dimensions: list[Dimension], metric_type: MetricTypes
    ) -> CachingMetric:
        metric = self.cache.get((name, metric_type))
        if metric is None:
            metric = self.add_metric_to_cache(name, unit, [d.name for d in dimensions], metric_type)
        return metric

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: Any = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        self._record(name, value, unit, idx, dimensions, metric_type)

    def add_counter(
        self, name: str, value: float, idx: Any = None, dimensions: list[Dimension] | None = None
    ) -> None:
        self._record(name, value, "count", idx, dimensions, MetricTypes.COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "ms",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        if unit not in TIME_UNITS:
            raise ValueError("the unit for a timed metric should be one of ['ms', 's']")
        self._record(name, value, unit, idx, dimensions, metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "MB",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        if unit not in SIZE_UNITS:
            raise ValueError("The unit for size based metric is one of ['MB','kB', 'GB', 'B']")
        self._record(name, value, unit, idx, dimensions, metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: Any = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self._record(name, value, "percent", idx, dimensions, metric_type)

    def add_error(self, name: str, value: float, dimensions: list[Dimension] | None = None) -> None:
        dims = list(dimensions or [])
        if "Level" not in [d.name for d in dims]:
            dims.append(Dimension("Level", "Error"))
        self._record(name, value, "", None, dims, MetricTypes.COUNTER)

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes = MetricTypes.COUNTER
    ) -> CachingMetric:
        metric = self.cache.get((metric_name, metric_type))
        if metric is None:
            raise KeyError(f"no {metric_type.value} metric {metric_name!r} in the cache")
        return metric

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> CachingMetric:
        metric = CachingMetric(metric_name, unit, dimension_names, metric_type)
        self.cache[(metric_name, metric_type)] = metric
        return metric
