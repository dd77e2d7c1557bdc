"""The tree's metrics files merged fast: the same series and values as prometheus_client's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from appliance.observability.metric_files import MetricFiles

# One process's metrics, as the appliance's processes record them (and a
# model's own gauge, which prometheus_client merges).
RECORD = """
import sys
from prometheus_client import Counter, Gauge, Histogram
calls = Counter("calls", "Calls by model.", ["protocol", "model"])
seconds = Histogram("seconds", "Latency.", ["model"], buckets=(0.001, 0.01, 0.1))
gauge = Gauge("own_gauge", "A model's own.", ["model"], multiprocess_mode="livesum")
scale = int(sys.argv[1])
for index in range(3):
    model = f'm{index}"\\\\\\n'  # a label value that needs escaping
    calls.labels("kserve", model).inc(scale * (index + 1))
    seconds.labels(model).observe(0.005 * scale)
    seconds.labels(model).observe(0.5)
gauge.labels("m0").set(scale)
"""


def record(directory: Path, scale: int) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", RECORD, str(scale)], env=env, check=True, timeout=60)


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample: sums may differ in the last bit with the order files are read."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def stock(directory: Path) -> str:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return generate_latest(registry).decode()


def ours(files: MetricFiles) -> str:
    counted, others = files.text()
    registry = CollectorRegistry()
    if others is not None:
        registry.register(others)
    return counted.decode() + generate_latest(registry).decode()


def test_the_same_series_as_prometheus_client_and_changes_are_seen(tmp_path: Path) -> None:
    record(tmp_path, 1)
    record(tmp_path, 2)
    files = MetricFiles(str(tmp_path))
    expected = series(stock(tmp_path))
    assert series(ours(files)) == pytest.approx(expected)
    assert expected[("calls_total", (("model", 'm2"\\\n'), ("protocol", "kserve")))] == 9.0
    # Two processes observed twice each.
    assert expected[("seconds_count", (("model", 'm0"\\\n'),))] == 4.0
    # Cached files are read again once they change; a new process's file is added.
    assert series(ours(files)) == pytest.approx(expected)
    record(tmp_path, 3)
    again = series(stock(tmp_path))
    assert again != expected
    assert series(ours(files)) == pytest.approx(again)


def test_the_text_has_one_help_and_type_per_family(tmp_path: Path) -> None:
    record(tmp_path, 1)
    text, _others = MetricFiles(str(tmp_path)).text()
    lines = text.decode().splitlines()
    assert lines.count("# TYPE calls_total counter") == 1
    assert lines.count("# TYPE seconds histogram") == 1
    assert any(line.startswith('seconds_bucket{le="+Inf",model=') for line in lines)


def test_samples_of_named_families_as_prometheus_client_merges_them(tmp_path: Path) -> None:
    record(tmp_path, 1)
    record(tmp_path, 2)
    files = [str(path) for path in tmp_path.glob("*.db")]
    expected = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in MultiProcessCollector.merge(files)
        if metric.name in ("calls", "seconds")
        for sample in metric.samples
    }
    found = {
        (name, tuple(sorted(labels.items()))): value
        for name, labels, value in MetricFiles(str(tmp_path)).samples({"calls", "seconds"})
    }
    assert found == pytest.approx(expected)
