"""Prometheus metrics, added up across every process of the tree.

Each process records into prometheus_client's multiprocess files under
``<tree dir>/metrics``: the master sets ``PROMETHEUS_MULTIPROC_DIR`` for its
children before they start, and the library picks it up at import. GET
/metrics on the HTTP port adds the files up (counters survive restarts),
together with gauges read at scrape time from the status table and the
master (see ``frontends/metrics.py``). A process started without the
variable (a test, a benchmark) records in memory only.

Frontends say which protocol a request came in by (:data:`PROTOCOL`, set
per request); the client API records every model call under that label, and
notes the model in :data:`MODEL` for the access log line.
"""

from __future__ import annotations

import bisect
import contextvars
import os
import struct
import threading
import time
from collections.abc import Container, Iterable
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram

from appliance.errors import ErrorCode
from appliance.observability import logs
from appliance.observability.metric_files import MetricFiles

PROTOCOL: contextvars.ContextVar[str] = contextvars.ContextVar("protocol", default="internal")
MODEL: contextvars.ContextVar[str] = contextvars.ContextVar("model", default="")

_SECONDS = (
    *(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
    *(0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

REQUESTS = Counter(
    "appliance_model_requests",
    "Calls to models, by protocol, model and outcome (ok or the error kind).",
    ["protocol", "model", "outcome"],
)
LATENCY = Histogram(
    "appliance_model_request_duration_seconds",
    "Time from a frontend sending a request to a model until the reply.",
    ["protocol", "model"],
    buckets=_SECONDS,
)
CACHE_LOOKUPS = Counter(
    "appliance_response_cache_lookups",
    "Response cache lookups, by model and result (hit or miss).",
    ["model", "result"],
)
CACHE_SECONDS = Counter(
    "appliance_response_cache_seconds",
    "Time spent on response cache lookups (and a miss's insertion), by model and result.",
    ["model", "result"],
)
# The families a model call is recorded into, as read back (call_samples),
# and the names of their samples.
CALL_FAMILIES = (
    "appliance_model_requests",
    "appliance_model_request_duration_seconds",
    "appliance_response_cache_lookups",
    "appliance_response_cache_seconds",
)
CACHE_LOOKUPS_TOTAL = "appliance_response_cache_lookups_total"
CACHE_SECONDS_TOTAL = "appliance_response_cache_seconds_total"
CALLS_TOTAL = "appliance_model_requests_total"
CALL_SECONDS_BUCKET = "appliance_model_request_duration_seconds_bucket"
CALL_SECONDS_SUM = "appliance_model_request_duration_seconds_sum"
CALL_SECONDS_COUNT = "appliance_model_request_duration_seconds_count"
_files: MetricFiles | None = None
_TWO_DOUBLES = struct.Struct("dd")
# Direct writes of metric values (see Written): the event loop's and the frontends' threads'.
_WRITES = threading.Lock()
BATCH_ROWS = Histogram(
    "appliance_batch_rows",
    "Rows per batch a model instance ran.",
    ["model"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
QUEUE = Histogram(
    "appliance_queue_duration_seconds",
    "Time requests waited in a model instance's queue.",
    ["model"],
    buckets=_SECONDS,
)
COMPUTE = Histogram(
    "appliance_compute_duration_seconds",
    "Time a model spent on one batch.",
    ["model"],
    buckets=_SECONDS,
)
FRONTEND_FAMILY = "appliance_frontend_requests"
FRONTEND_TOTAL = "appliance_frontend_requests_total"
FRONTEND = Counter(
    FRONTEND_FAMILY,
    "Requests answered by the frontends, by protocol and wire status.",
    ["protocol", "status"],
)

# A stream's responses (a language model's tokens, one response each): how soon
# the first came, and how many, so that tokens per second is their rate.
STREAM_FIRST = Histogram(
    "appliance_stream_first_response_seconds",
    "Time from a frontend opening a stream to its first response (time to first token).",
    ["protocol", "model"],
    buckets=_SECONDS,
)
STREAM_RESPONSES = Counter(
    "appliance_stream_responses",
    "Responses of streams (a token-streaming model's tokens), by protocol and model.",
    ["protocol", "model"],
)

# The outcome label of each error code (a call's, on appliance_model_requests).
OUTCOMES = {code: code.name.lower() for code in ErrorCode}
OUTCOMES[ErrorCode.OK] = "ok"


# PERF: looking up a labelled child costs as much as recording into it, so
# each process keeps the children it has used.
_CALLS: dict[tuple[str, str, ErrorCode], tuple[Written, Observed]] = {}
_BATCHES: dict[str, tuple[Tally, Tally, Tally]] = {}
# Wire statuses are few per protocol; a client cannot make up new ones.
_FRONTEND: dict[tuple[str, str], Written] = {}


def record_call(model: str, code: ErrorCode, started: float) -> None:
    """Count one model call; ``started`` is its time.perf_counter()."""
    protocol = PROTOCOL.get()
    # An unknown model's name comes from the client: never a label value,
    # or any caller could grow the metrics without bound.
    label = "" if code is ErrorCode.MODEL_NOT_FOUND else model
    MODEL.set(label)
    key = (protocol, label, code)
    children = _CALLS.get(key)
    if children is None:
        children = (
            Written(REQUESTS.labels(protocol, label, OUTCOMES[code])._value),
            Observed(LATENCY.labels(protocol, label)),
        )
        _CALLS[key] = children
    children[0].add(1.0)
    children[1].observe(time.perf_counter() - started)


_STREAMS: dict[tuple[str, str], tuple[Written, Observed]] = {}


def record_stream_response(model: str, started: float | None) -> None:
    """Count one response of a stream; ``started`` (its time.perf_counter() at opening)
    only for its first, whose wait is observed."""
    key = (PROTOCOL.get(), model)
    children = _STREAMS.get(key)
    if children is None:
        value = STREAM_RESPONSES.labels(*key)._value
        children = (Written(value), Observed(STREAM_FIRST.labels(*key)))
        _STREAMS[key] = children
    children[0].add(1.0)
    if started is not None:
        children[1].observe(time.perf_counter() - started)


def record_cache(model: str, hit: bool, seconds: float) -> None:
    """Count one response cache lookup of ``model`` (a hit answers the call: counted too)."""
    result = "hit" if hit else "miss"
    CACHE_LOOKUPS.labels(model, result).inc()
    CACHE_SECONDS.labels(model, result).inc(seconds)


def call_samples(
    families: Container[str] = CALL_FAMILIES,
) -> Iterable[tuple[str, dict[str, str], float]]:
    """Yield (sample name, labels, value) of the model-call families (or ``families``),
    every process's."""
    global _files
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        # PERF: kept between reads, so the files of idle models are not parsed again.
        if _files is None or str(_files.directory) != directory:
            _files = MetricFiles(directory)
        yield from _files.samples(families)
        return
    # A process outside an appliance tree records in memory only.
    for metric in REGISTRY.collect():
        if metric.name in families:
            for sample in metric.samples:
                yield sample.name, sample.labels, sample.value


class Tally:
    """Observations of one histogram child, kept in the process and added to it at once.

    PERF: in multiprocess mode each observe takes a lock, checks the pid and
    writes the child's file twice (its sum and one bucket). A model worker
    observes three histograms per batch; that was about a fifth of an
    identity worker's CPU per request at 16 clients. Tallied, the files are
    written once per flush instead, with the same totals.

    prometheus_client has no call that adds many observations at once, so
    :meth:`flush` adds to the child's sum and bucket values itself
    (``_sum``, ``_buckets``, ``_upper_bounds``: the attributes its own
    ``observe`` uses); tests/unit/test_metrics_tally.py checks that the
    exposition matches observing one by one.
    """

    __slots__ = ("_bounds", "_buckets", "_counts", "_sum", "_total")

    def __init__(self, child: Any) -> None:
        self._buckets = [Written(bucket) for bucket in child._buckets]
        self._total = Written(child._sum)
        self._bounds: list[float] = list(child._upper_bounds)
        # Observations by bucket index, of the buckets observed since the last flush.
        self._counts: dict[int, int] = {}
        self._sum = 0.0

    def observe(self, value: float) -> None:
        # The first bucket whose upper bound is >= value, as Histogram.observe picks.
        index = bisect.bisect_left(self._bounds, value)
        counts = self._counts
        counts[index] = counts.get(index, 0) + 1
        self._sum += value

    def flush(self) -> None:
        counts = self._counts
        if not counts:
            return
        self._total.add(self._sum)
        buckets = self._buckets
        for index, count in counts.items():
            buckets[index].add(count)
        self._counts = {}
        self._sum = 0.0


class Observed:
    """A histogram child observed in place: its bucket and sum written at once (see Written)."""

    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(self, child: Any) -> None:
        self._bounds: list[float] = list(child._upper_bounds)
        self._buckets = [Written(bucket) for bucket in child._buckets]
        self._sum = Written(child._sum)

    def observe(self, value: float) -> None:
        # The first bucket whose upper bound is >= value, as Histogram.observe picks.
        self._buckets[bisect.bisect_left(self._bounds, value)].add(1.0)
        self._sum.add(value)


class Written:
    """One metric child's value, added to in place in its process's metrics file.

    PERF: a multiprocess value's ``inc`` checks the metric, takes a lock and
    asks the pid (to notice a fork), then writes through two calls: about 150
    bytecodes, and a frontend makes four a request, a model worker six each
    time it goes idle. Every child written here is made in the process that
    writes it, after any fork (gunicorn's, the zygote's), and written only
    here, under one lock; so the two doubles ``inc`` would write are written
    at the place the value took in the file when it was made
    (prometheus_client's MmapedDict layout: value, then timestamp 0). A file
    that grows is mapped again, so its map is looked up on every write; the
    places in it stay.
    """

    __slots__ = ("_file", "_position", "_value")

    def __init__(self, value: Any) -> None:
        self._value = value
        self._file = value._file if getattr(value, "_multiprocess", False) else None
        # A multiprocess value reads itself from its file when made: its place is there.
        self._position = -1 if self._file is None else self._file._positions[value._key]

    def add(self, amount: float) -> None:
        value, file = self._value, self._file
        if file is None:
            value.inc(amount)
            return
        with _WRITES:
            total = value._value + amount
            value._value = total
            _TWO_DOUBLES.pack_into(file._m, self._position, total, 0.0)


def record_batch(model: str, rows: int, waits_s: list[float], compute_s: float) -> None:
    """Count one batch a model worker ran; it shows once :func:`flush_batches` runs."""
    tallies = _BATCHES.get(model)
    if tallies is None:
        tallies = (
            Tally(BATCH_ROWS.labels(model)),
            Tally(QUEUE.labels(model)),
            Tally(COMPUTE.labels(model)),
        )
        _BATCHES[model] = tallies
    rows_tally, queue, compute = tallies
    rows_tally.observe(rows)
    for wait in waits_s:
        queue.observe(wait)
    compute.observe(compute_s)


def flush_batches() -> None:
    """Add the batches counted since the last flush to the metrics files.

    A model worker calls this with its status counters: when it goes idle,
    and at least every tenth of a second while busy.
    """
    for tallies in _BATCHES.values():
        for tally in tallies:
            tally.flush()


def log_access(protocol: str, status: str, started: float, detail: str = "") -> None:
    """Count a frontend request and write its access line (if the access log is on)."""
    key = (protocol, status)
    value = _FRONTEND.get(key)
    if value is None:
        value = _FRONTEND[key] = Written(FRONTEND.labels(protocol, status)._value)
    value.add(1.0)
    latency_ms = (time.perf_counter() - started) * 1000
    logs.access(protocol, MODEL.get(), status, latency_ms, detail)
