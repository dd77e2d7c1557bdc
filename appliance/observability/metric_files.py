"""The tree's counters and histograms, merged from every process's multiprocess files.

prometheus_client's MultiProcessCollector parses every key of every file
(JSON) and builds a Sample per value each time, and ``generate_latest``
formats each one: with 200 models (10,000 series) a /metrics scrape took
1.3-2 s on 2 vCPUs, and the dashboard's traffic, read every second, nearly
as long. Here a file whose bytes are those of the last read (an idle
model's, most of them) is not parsed again, a key is parsed once per
process, and a series' name and labels are formatted once: the same series
in a fraction of the time. Files of any other type (a model's own gauges or
summaries) still go through prometheus_client.

The files are prometheus_client's (``mmap_dict.py``): a 4-byte length in use,
4 bytes of padding, then entries of a 4-byte key length, the UTF-8 key
(``[metric, sample, labels, help]`` as JSON) padded to 8 bytes, and two
doubles, the value and a timestamp.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_INT = struct.Struct("<i")
_TWO_DOUBLES = struct.Struct("<dd")
# What this module merges itself; any other type goes to prometheus_client.
# The "triton" ones are Triton Python models' own (runtimes/custom_metrics.py):
# shown as Triton shows them, a counter without "_total", a gauge summed.
_TRITON = "triton"
# The "ts" ones are TorchServe handlers' (runtimes/ts_model_metrics.py): shown as
# TorchServe's Java frontend writes them, a gauge the last value any process set.
TORCHSERVE = "ts"
_KINDS = ("counter", "gauge", "histogram")
_OWN_TYPES = ("counter", "histogram", *(p + k for p in (_TRITON, TORCHSERVE) for k in _KINDS))
Labels = tuple[tuple[str, str], ...]
# metric, sample, labels (sorted), help
Key = tuple[str, str, Labels, str]


@dataclass(slots=True)
class _Family:
    kind: str
    help: str
    # (sample name, labels) -> value: counters, and a histogram's _sum.
    values: dict[tuple[str, Labels], float] = field(default_factory=dict)
    # A histogram's labels without "le" -> upper bound -> count in that bucket.
    buckets: dict[Labels, dict[float, float]] = field(default_factory=dict)
    # A TorchServe gauge's series -> when its value was set.
    stamps: dict[tuple[str, Labels], float] = field(default_factory=dict)


class MetricFiles:
    """Merge ``directory``'s ``*.db`` files into Prometheus text; keep caches between calls."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self._keys: dict[bytes, Key] = {}
        # path -> (the bytes last read, what they held: key, value, timestamp)
        self._files: dict[str, tuple[bytes, list[tuple[Key, float, float]]]] = {}
        self._bounds: dict[Labels, tuple[Labels, float]] = {}
        self._series: dict[tuple[str, Labels], str] = {}
        self._lock = threading.Lock()

    def text(self) -> tuple[bytes, Collector | None]:
        """Counters and histograms as text, and a collector for the other files (if any)."""
        families, others = self._merge(None)
        return self._render(families).encode(), _Others(others) if others else None

    def samples(self, only: Container[str]) -> Iterator[tuple[str, dict[str, str], float]]:
        """(sample, labels, value) of the counter and histogram families named in ``only``,
        as prometheus_client merges them: a histogram's buckets cumulative, with _count."""
        families, _others = self._merge(only)
        for metric, family in families.items():
            for (sample, labels), value in family.values.items():
                yield sample, dict(labels), value
            for labels, counts in family.buckets.items():
                total = 0.0
                for bound, count in sorted(counts.items()):
                    total += count
                    yield f"{metric}_bucket", {**dict(labels), "le": go_number(bound)}, total
                yield f"{metric}_count", dict(labels), total

    def _merge(self, only: Container[str] | None) -> tuple[dict[str, _Family], list[str]]:
        # The caches are shared by the threads of an HTTP worker that serve /metrics
        # and the dashboard.
        with self._lock:
            return self._merge_locked(only)

    def _merge_locked(self, only: Container[str] | None) -> tuple[dict[str, _Family], list[str]]:
        families: dict[str, _Family] = {}
        others: list[str] = []
        seen = set()
        for path in sorted(self.directory.glob("*.db")):
            kind = path.name.split("_", 1)[0]
            if kind not in _OWN_TYPES:
                others.append(str(path))
                continue
            seen.add(str(path))
            for key, value, stamp in self._read(str(path)):
                if only is None or key[0] in only:
                    self._add(families, kind, key, value, stamp)
        for gone in set(self._files) - seen:
            del self._files[gone]
        return families, others

    def _read(self, path: str) -> list[tuple[Key, float, float]]:
        try:
            with open(path, "rb") as file:
                head = file.read(8)
                used = _INT.unpack_from(head, 0)[0] if len(head) == 8 else 0
                data = head + file.read(max(0, used - 8))
        except FileNotFoundError:
            return []
        cached = self._files.get(path)
        if cached is not None and cached[0] == data:
            return cached[1]
        entries = []
        position = 8
        while position < used:
            length = _INT.unpack_from(data, position)[0]
            if position + 4 + length > used:
                raise RuntimeError(f"metrics file {path} is corrupted")
            raw = data[position + 4 : position + 4 + length]
            position += 4 + length + (8 - (length + 4) % 8)
            value, stamp = _TWO_DOUBLES.unpack_from(data, position)
            entries.append((self._key(raw), value, stamp))
            position += 16
        self._files[path] = (data, entries)
        return entries

    def _key(self, raw: bytes) -> Key:
        key = self._keys.get(raw)
        if key is None:
            metric, sample, labels, text = orjson.loads(raw)
            key = self._keys[raw] = (metric, sample, tuple(sorted(labels.items())), text)
        return key

    def _add(
        self, families: dict[str, _Family], kind: str, key: Key, value: float, stamp: float
    ) -> None:
        metric, sample, labels, text = key
        family = families.get(metric)
        if family is None:
            family = families[metric] = _Family(kind, text)
        if kind == TORCHSERVE + "gauge":
            series = (sample, labels)
            if stamp >= family.stamps.get(series, -1.0):
                family.stamps[series] = stamp
                family.values[series] = value
            return
        kind = kind.removeprefix(_TRITON).removeprefix(TORCHSERVE)
        if kind == "histogram" and sample.endswith("_bucket"):
            without, bound = self._bound(labels)
            counts = family.buckets.setdefault(without, {})
            counts[bound] = counts.get(bound, 0.0) + value
        elif not (kind == "histogram" and sample.endswith("_count")):
            # A histogram's _count is the sum of its buckets, as prometheus_client makes it.
            series = (sample, labels)
            family.values[series] = family.values.get(series, 0.0) + value

    def _bound(self, labels: Labels) -> tuple[Labels, float]:
        found = self._bounds.get(labels)
        if found is None:
            without = tuple(item for item in labels if item[0] != "le")
            bound = float(next(value for name, value in labels if name == "le"))
            found = self._bounds[labels] = (without, bound)
        return found

    def _render(self, families: dict[str, _Family]) -> str:
        lines: list[str] = []
        for metric, family in families.items():
            if family.kind.startswith(TORCHSERVE):
                _render_torchserve(metric, family, lines)
                continue
            name = f"{metric}_total" if family.kind == "counter" else metric
            escaped = family.help.replace("\\", r"\\").replace("\n", r"\n")
            kind = family.kind.removeprefix(_TRITON)
            lines.append(f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n")
            for (sample, labels), value in family.values.items():
                lines.append(f"{self._prefix(sample, labels)} {go_number(value)}\n")
            for labels, counts in family.buckets.items():
                total = 0.0
                for bound, count in sorted(counts.items()):
                    total += count
                    series = (*labels, ("le", go_number(bound)))
                    lines.append(f"{self._prefix(metric + '_bucket', series)} ")
                    lines.append(f"{go_number(total)}\n")
                lines.append(f"{self._prefix(metric + '_count', labels)} ")
                lines.append(f"{go_number(total)}\n")
        return "".join(lines)

    def _prefix(self, sample: str, labels: Labels) -> str:
        """``name{label="value",...}`` as generate_latest writes it (labels sorted)."""
        key = (sample, labels)
        prefix = self._series.get(key)
        if prefix is None:
            pairs = ",".join(
                f'{escape_label_name(name)}="{escape_value(value)}"'
                for name, value in sorted(labels)
            )
            prefix = escape_metric_name(sample) + (f"{{{pairs}}}" if pairs else "")
            self._series[key] = prefix
        return prefix


def _render_torchserve(metric: str, family: _Family, lines: list[str]) -> None:
    """A TorchServe handler's family as TorchServe's Java frontend writes it: its unit
    in the help, labels in the handler's order and then a comma, doubles as Java prints them."""
    kind = family.kind.removeprefix(TORCHSERVE)
    unit, _, order = family.help.partition("\t")
    lines.append(f"# HELP {metric} Torchserve prometheus {kind} metric with unit: {unit}\n")
    lines.append(f"# TYPE {metric} {kind}\n")
    rank = {name: index for index, name in enumerate(order.split(","))}

    def sample(name: str, labels: Labels, value: float) -> str:
        ordered = sorted(labels, key=lambda item: (item[0] == "le", rank.get(item[0], len(rank))))
        pairs = "".join(f'{label}="{escape_value(text)}",' for label, text in ordered)
        return f"{name}{{{pairs}}} {java_number(value)}\n"

    if kind != "histogram":
        for (name, labels), value in family.values.items():
            lines.append(sample(name, labels, value))
        return
    for labels, counts in family.buckets.items():
        total = 0.0
        for bound, count in sorted(counts.items()):
            total += count
            lines.append(sample(f"{metric}_bucket", (*labels, ("le", java_number(bound))), total))
        lines.append(sample(f"{metric}_count", labels, total))
        lines.append(
            sample(f"{metric}_sum", labels, family.values.get((f"{metric}_sum", labels), 0.0))
        )


def java_number(value: float) -> str:
    """A double as the Prometheus Java client writes it (``1.0``, ``+Inf``)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def go_number(value: float) -> str:
    """A value as Go (and so Prometheus) writes it."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def escape_value(value: str) -> str:
    """A label's value as the text format escapes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Others(Collector):
    """Files of types prometheus_client merges (a model's own gauges, summaries)."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def collect(self) -> Iterable[Metric]:
        merged: Iterable[Metric] = MultiProcessCollector.merge(self.files)  # type: ignore[no-untyped-call]
        return merged
