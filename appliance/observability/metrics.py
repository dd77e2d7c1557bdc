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

import asyncio
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
# Batches recorded and not yet tallied: (model, rows, waits, compute seconds).
_RECORDED: list[tuple[str, int, list[float], float]] = []
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
    writes = _writes()
    writes.add(children[0])
    writes.observe(children[1], time.perf_counter() - started)


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
    _writes().add(children[0])
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

    __slots__ = ("_bounds", "_counts", "_observed", "_sum")

    def __init__(self, observed: Observed) -> None:
        self._observed = observed
        self._bounds = observed.bounds
        # Observations by bucket index, of the buckets observed since the last flush.
        self._counts: dict[int, int] = {}
        self._sum = 0.0

    def observe(self, value: float) -> bool:
        """Tally ``value``; True when it is the first since the last flush."""
        # The first bucket whose upper bound is >= value, as Histogram.observe picks.
        index = bisect.bisect_left(self._bounds, value)
        counts = self._counts
        first = not counts
        counts[index] = counts.get(index, 0) + 1
        self._sum += value
        return first

    def flush(self) -> None:
        if self._counts:
            with _WRITES:
                self.flush_held()

    def flush_held(self) -> None:
        """:meth:`flush`, the caller holding the writes' lock."""
        counts = self._counts
        if counts:
            self._observed.add_held(counts, self._sum)
            self._counts = {}
            self._sum = 0.0


class Observed:
    """A histogram child observed in place: its bucket and sum written at once (see Written)."""

    __slots__ = ("_buckets", "_sum", "bounds")

    def __init__(self, child: Any) -> None:
        self.bounds: list[float] = list(child._upper_bounds)
        self._buckets = [Written(bucket) for bucket in child._buckets]
        self._sum = Written(child._sum)

    def observe(self, value: float) -> None:
        with _WRITES:
            # The first bucket whose upper bound is >= value, as Histogram.observe picks.
            self._buckets[bisect.bisect_left(self.bounds, value)].add_held(1.0)
            self._sum.add_held(value)

    def add_held(self, counts: dict[int, int], total: float) -> None:
        """Add observations (their number by bucket index, and their sum), the caller
        holding the writes' lock."""
        buckets = self._buckets
        for index, count in counts.items():
            buckets[index].add_held(count)
        self._sum.add_held(total)


class Written:
    """One metric child's value, added to in place in its process's metrics file.

    PERF: a multiprocess value's ``inc`` checks the metric, takes a lock and
    asks the pid (to notice a fork), then writes through two calls: about 150
    bytecodes, and a frontend made four a request (now a few a loop turn, see
    _Turn), a model worker six each time it goes idle. Every child written
    here is made in the process that writes it, after any fork (gunicorn's,
    the zygote's), and written only here, under one lock; so the two doubles
    ``inc`` would write are written at the place the value took in the file
    when it was made (prometheus_client's MmapedDict layout: value, then
    timestamp 0). A file that grows is mapped again, so its map is looked up
    on every write; the places in it stay.
    """

    __slots__ = ("_file", "_position", "_value")

    def __init__(self, value: Any) -> None:
        self._value = value
        self._file = value._file if getattr(value, "_multiprocess", False) else None
        # A multiprocess value reads itself from its file when made: its place is there.
        self._position = -1 if self._file is None else self._file._positions[value._key]

    def add(self, amount: float) -> None:
        with _WRITES:
            self.add_held(amount)

    def add_held(self, amount: float) -> None:
        """:meth:`add`, the caller holding the writes' lock."""
        value, file = self._value, self._file
        if file is None:
            value.inc(amount)
            return
        total = value._value + amount
        value._value = total
        _TWO_DOUBLES.pack_into(file._m, self._position, total, 0.0)


class _Turn:
    """What an event loop's turn counted, written to the files once the turn ends.

    PERF: a frontend counted each request into three values of its metrics
    file (the call, its latency, the wire status), each write under the lock,
    as it answered. Its loop answers several requests a turn under load (3.6
    at 16 KServe REST clients); their counts now go in one write per value,
    under one lock, in a callback the turn's first count scheduled. Like the
    turn's sends (client/aio.py), the writes leave at once after the turn's
    replies: metrics asked right after an answer include it.
    """

    __slots__ = ("_counts", "_tallies", "_touched", "due", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.due = False
        self._counts: dict[Written, float] = {}
        self._tallies: dict[Observed, Tally] = {}
        # The tallies observed this turn.
        self._touched: list[Tally] = []

    def add(self, value: Written) -> None:
        counts = self._counts
        counts[value] = counts.get(value, 0.0) + 1.0

    def observe(self, observed: Observed, seconds: float) -> None:
        tally = self._tallies.get(observed)
        if tally is None:
            tally = self._tallies[observed] = Tally(observed)
        if tally.observe(seconds):
            self._touched.append(tally)

    def flush(self) -> None:
        self.due = False
        counts, self._counts = self._counts, {}
        touched, self._touched = self._touched, []
        with _WRITES:
            for value, amount in counts.items():
                value.add_held(amount)
            for tally in touched:
                tally.flush_held()


class _AtOnce:
    """A :class:`_Turn`'s counts written at once: outside an event loop (a thread's call)."""

    def add(self, value: Written) -> None:
        value.add(1.0)

    def observe(self, observed: Observed, seconds: float) -> None:
        observed.observe(seconds)


_AT_ONCE = _AtOnce()
# This thread's turn (the event loop running in it), its attribute "turn".
_LOCAL = threading.local()


def _writes() -> _Turn | _AtOnce:
    """Where this thread's counts go: the running event loop's turn, its flush
    scheduled, or straight to the files outside an event loop."""
    loop = asyncio._get_running_loop()
    if loop is None:
        return _AT_ONCE
    turn: _Turn | None = getattr(_LOCAL, "turn", None)
    if turn is None or turn.loop is not loop:
        if turn is not None and turn.due:
            turn.flush()  # the thread's last loop ended before its turn did
        turn = _Turn(loop)
        _LOCAL.turn = turn
    if not turn.due:
        turn.due = True
        loop.call_soon(turn.flush)
    return turn


def record_batch(model: str, rows: int, waits_s: list[float], compute_s: float) -> None:
    """Count one batch a model worker ran; it shows once :func:`flush_batches` runs.

    PERF: kept as it came and sorted into buckets at the flush: a worker that
    answers one request at a time takes up each batch's three observations
    with caches the wait for it emptied, and finding a bucket touches objects
    all over the heap (bounds, dictionaries).
    """
    _RECORDED.append((model, rows, waits_s, compute_s))


def flush_batches() -> None:
    """Add the batches counted since the last flush to the metrics files.

    A model worker calls this every tenth of a second while busy, and once it
    has been idle a few milliseconds (worker/own_slot.py).
    """
    recorded = _RECORDED[:]
    # Those taken only: any recorded meanwhile wait for the next flush.
    del _RECORDED[: len(recorded)]
    with _WRITES:
        for model, rows, waits_s, compute_s in recorded:
            rows_tally, queue, compute = _tallies_of(model)
            rows_tally.observe(rows)
            for wait in waits_s:
                queue.observe(wait)
            compute.observe(compute_s)
        for tallies in _BATCHES.values():
            for tally in tallies:
                tally.flush_held()


def _tallies_of(model: str) -> tuple[Tally, Tally, Tally]:
    tallies = _BATCHES.get(model)
    if tallies is None:
        tallies = (
            Tally(Observed(BATCH_ROWS.labels(model))),
            Tally(Observed(QUEUE.labels(model))),
            Tally(Observed(COMPUTE.labels(model))),
        )
        _BATCHES[model] = tallies
    return tallies


def log_access(protocol: str, status: str, started: float, detail: str = "") -> None:
    """Count a frontend request and write its access line (if the access log is on)."""
    key = (protocol, status)
    value = _FRONTEND.get(key)
    if value is None:
        value = _FRONTEND[key] = Written(FRONTEND.labels(protocol, status)._value)
    _writes().add(value)
    latency_ms = (time.perf_counter() - started) * 1000
    logs.access(protocol, MODEL.get(), status, latency_ms, detail)
