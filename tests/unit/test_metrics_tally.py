"""A tallied histogram exposes what observing each value one by one exposes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from appliance.observability.metrics import Observed, Tally

# Binary fractions: sums in any order are exact, so expositions compare as text.
BOUNDS = (0.125, 0.25, 0.5, 1.0, 2.0, 8.0)


def exposition(values: list[float], tallied: bool, flushes: int = 1) -> str:
    """The histogram's exposition text, less its creation time."""
    registry = CollectorRegistry()
    histogram = Histogram("h", "help", ["model"], buckets=BOUNDS, registry=registry)
    child = histogram.labels("m")
    if not tallied:
        for value in values:
            child.observe(value)
        return _without_created(registry)
    tally = Tally(Observed(child))
    step = max(1, len(values) // flushes)
    for start in range(0, len(values), step):
        for value in values[start : start + step]:
            tally.observe(value)
        tally.flush()
    tally.flush()  # a flush with nothing new adds nothing
    return _without_created(registry)


def _without_created(registry: CollectorRegistry) -> str:
    lines = generate_latest(registry).decode().splitlines()
    return "\n".join(line for line in lines if not line.startswith("h_created"))


values = st.lists(st.sampled_from([0.0, *BOUNDS, 0.0625, 0.75, 3.0, 1e6, -1.0]), max_size=60)


@given(values, st.integers(1, 5))
def test_tallied_and_observed_expose_the_same(observed: list[float], flushes: int) -> None:
    assert exposition(observed, True, flushes) == exposition(observed, False)


def test_values_on_a_bound_count_in_that_bucket() -> None:
    text = exposition([0.25, 0.25, 8.0, 9.0], True)
    assert 'h_bucket{le="0.125",model="m"} 0.0' in text
    assert 'h_bucket{le="0.25",model="m"} 2.0' in text
    assert 'h_bucket{le="8.0",model="m"} 3.0' in text
    assert 'h_bucket{le="+Inf",model="m"} 4.0' in text
    assert 'h_count{model="m"} 4.0' in text


# Run apart: prometheus_client picks its multiprocess values at import, from the environment.
_MULTIPROCESS = """
import sys
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from appliance.observability.metrics import Observed, Tally

values = [0.0, 0.125, 0.75, 3.0, 1e6, 0.25, 0.25]
bounds = (0.125, 0.25, 0.5, 1.0, 2.0, 8.0)
observed = Histogram("observed", "help", ["model"], buckets=bounds).labels("m")
tally = Tally(Observed(Histogram("tallied", "help", ["model"], buckets=bounds).labels("m")))
for value in values:
    observed.observe(value)
    tally.observe(value)
    if value > 1:
        tally.flush()
tally.flush()
registry = CollectorRegistry()
MultiProcessCollector(registry)
samples = {}
for metric in registry.collect():
    for sample in metric.samples:
        key = (sample.name.replace(metric.name, ""), tuple(sorted(sample.labels.items())))
        samples.setdefault(metric.name, {})[key] = sample.value
assert samples["observed"] == samples["tallied"], samples
print("same")
"""


def test_a_tally_writes_multiprocess_files_as_observing_does(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _MULTIPROCESS], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "same"
