"""Traces of requests across processes: Triton's trace settings, W3C context, OpenTelemetry spans.

A request crosses at least two processes: the frontend that decodes and
answers it, and the model worker that queues and computes it, in a batch
shared with others. A sampled request gets one trace that follows it:

- the frontend's server span (``<protocol> <model>``, from the request's
  arrival to its answer, a child of the caller's span when the request
  carries a W3C ``traceparent``: an HTTP header or gRPC metadata), with
  ``decode`` (arrival to the model call), ``infer`` (the model call) and
  ``encode`` (the call's end to the answer) under it;
- in the model worker, under ``infer``: ``queue`` (arrival to its batch),
  ``compute`` (its batch's run; linked to the batch's own span, which has
  the batch's rows and a link to every request it served) and ``reply``;
- for an ensemble, one ``infer`` span per step under the ensemble's
  ``infer``, each with its model worker's spans under it.

The context travels in the descriptor (``"trace"``: the ``infer`` span's
traceparent), so every protocol is traced by one mechanism.

Settings are Triton's trace extension: ``trace_level`` (OFF, TIMESTAMPS,
TENSORS), ``trace_rate`` (trace every N-th request), ``trace_count``
(traces left; -1 unlimited), ``log_frequency``, ``trace_file``,
``trace_mode`` (opentelemetry), global and per model, read and changed at
run time through ``/v2[/models/M]/trace/setting`` and gRPC ``TraceSetting``.
They start from the config's ``[traces]`` table; what the API changes is kept
in ``trace.json`` in the tree's directory, so every process of the tree sees
it within a second. ``trace_rate`` and ``trace_count`` are counted in each
frontend process.

Free when off: with every level OFF a request costs a dict lookup; the
OpenTelemetry SDK (the ``traces`` extra) is imported by a process only when
it first traces, and spans go to the OTLP/HTTP endpoint ``[traces] url``
(or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) in batches.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from appliance.errors import BadRequest

log = logging.getLogger("appliance.tracing")

SETTINGS_FILE = "trace.json"
LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("opentelemetry",)
DEFAULTS: dict[str, Any] = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "opentelemetry",
}
RECHECK_S = 1.0
SERVICE = "appliance"


def check_setting(name: str, value: Any) -> Any:
    """A setting's value as it is kept (a list of strings for trace_level, else a string).

    Raises:
        BadRequest: an unknown setting, or a value it cannot take.
    """
    if name not in DEFAULTS:
        raise BadRequest(f"unknown trace setting {name!r}; the settings are {', '.join(DEFAULTS)}")
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str | int) for v in values):
        raise BadRequest(f"trace setting {name}: expected a string, got {value!r}")
    texts = [str(v) for v in values]
    if name == "trace_level":
        levels = [v.upper() for v in texts]
        if any(v not in LEVELS for v in levels):
            raise BadRequest(f"trace_level: expected {', '.join(LEVELS)}, got {texts}")
        return levels
    if len(texts) != 1:
        raise BadRequest(f"trace setting {name}: expected one value, got {texts}")
    text = texts[0]
    minimum = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}.get(name)
    if minimum is not None:
        try:
            number = int(text)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise BadRequest(f"{name}: expected a whole number >= {minimum}, got {text!r}")
        return str(number)
    if name == "trace_mode" and text not in MODES:
        raise BadRequest(
            f"trace_mode: the appliance exports OpenTelemetry spans ({MODES[0]}), got {text!r}"
        )
    return text


def tracing_on(settings: Mapping[str, Any]) -> bool:
    return any(level != "OFF" for level in settings["trace_level"])


class TraceSettings:
    """The tree's trace settings, global and per model, as every process reads them.

    Args:
        directory: the tree's private directory.
        initial: the config's ``[traces]`` values (Triton's setting names).
        url: where spans go (OTLP/HTTP), "" for the exporter's default.
        export_ms: how long spans wait to be exported in a batch.
    """

    def __init__(
        self,
        directory: Path,
        initial: Mapping[str, Any] | None = None,
        url: str = "",
        export_ms: int = 1000,
    ) -> None:
        self._path = directory / SETTINGS_FILE
        self._lock_path = directory / f"{SETTINGS_FILE}.lock"
        self._base = dict(DEFAULTS)
        for name, value in (initial or {}).items():
            self._base[name] = check_setting(name, value)
        self.url = url
        self.export_ms = export_ms
        self._seen: tuple[int, int, int] | None = None
        self._checked = 0.0
        self._data: dict[str, Any] = {"global": {}, "models": {}}
        self._effective: dict[str | None, dict[str, Any]] = {}
        self._counts: dict[str, tuple[int, int]] = {}  # model -> (seen, traces left)
        self._on = False
        self._lock = threading.Lock()

    def get(self, model: str | None = None) -> dict[str, Any]:
        """The settings that apply to ``model`` (the global ones for None)."""
        with self._lock:
            self._refresh()
            return dict(self._settings(model))

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change settings (a None value clears a model's own); return what then applies.

        Raises:
            BadRequest: an unknown setting or a bad value; nothing changes.
        """
        checked = {
            name: None if value is None else check_setting(name, value)
            for name, value in changes.items()
        }
        with open(self._lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            own = data["global"] if model is None else data["models"].setdefault(model, {})
            for name, value in checked.items():
                if value is None:
                    own.pop(name, None)
                else:
                    own[name] = value
            temp = self._path.with_name(f".{SETTINGS_FILE}.{os.getpid()}.tmp")
            temp.write_bytes(orjson.dumps(data))
            temp.replace(self._path)
        with self._lock:
            self._checked = 0.0
        return self.get(model)

    def any_on(self) -> bool:
        """Whether any model may be traced now (cheap: checked at most once a second)."""
        # PERF: every request asks; no lock unless the second is up.
        if time.monotonic() - self._checked >= RECHECK_S:
            with self._lock:
                self._refresh()
        return self._on

    def sampled(self, model: str, traceparent: str | None) -> bool:
        """Whether to trace this request of ``model``: its level, rate and count say so.

        A request whose caller sampled its own trace (the traceparent's flag)
        is traced whenever the level is not OFF.
        """
        with self._lock:
            self._refresh()
            settings = self._settings(model)
            if not tracing_on(settings):
                return False
            seen, left = self._counts.get(model, (0, int(settings["trace_count"])))
            if left == 0:
                return False
            caller = traceparent is not None and traceparent.endswith("-01")
            seen += 1
            take = caller or seen % int(settings["trace_rate"]) == 0
            if take and left > 0:
                left -= 1
            self._counts[model] = (seen, left)
            return take

    def _settings(self, model: str | None) -> dict[str, Any]:
        cached = self._effective.get(model)
        if cached is None:
            cached = {**self._base, **self._data["global"]}
            if model is not None:
                cached.update(self._data["models"].get(model, {}))
            self._effective[model] = cached
        return cached

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < RECHECK_S:
            return
        self._checked = now
        try:
            info = os.stat(self._path)
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            seen = (0, 0, 0)
        if seen != self._seen:
            self._seen = seen
            self._data = self._read()
            self._counts.clear()
        self._effective = {}
        self._on = tracing_on({**self._base, **self._data["global"]}) or any(
            tracing_on({**self._base, **self._data["global"], **own})
            for own in self._data["models"].values()
        )

    def _read(self) -> dict[str, Any]:
        try:
            data = orjson.loads(self._path.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError):
            data = {}
        data.setdefault("global", {})
        data.setdefault("models", {})
        return dict(data)


# -- this process's settings and exporter ------------------------------------------------

_SETTINGS: TraceSettings | None = None
_TRACER: Any = None
_TRACER_FAILED = False
_TRACER_LOCK = threading.Lock()


def configure(settings: TraceSettings | None) -> None:
    """Set this process's trace settings (a frontend's or a model worker's)."""
    global _SETTINGS
    _SETTINGS = settings


def configure_from(directory: Path, config: Any) -> None:
    """Set this process's trace settings from the config's ``[traces]`` (a TracesConfig)."""
    configure(TraceSettings(directory, config.initial(), config.url, config.export_ms))


def settings() -> TraceSettings | None:
    return _SETTINGS


def tracer() -> Any:
    """This process's OpenTelemetry tracer, made on first use; None without the SDK."""
    global _TRACER, _TRACER_FAILED
    if _TRACER is not None or _TRACER_FAILED:
        return _TRACER
    with _TRACER_LOCK:
        if _TRACER is None and not _TRACER_FAILED:
            try:
                _TRACER = _make_tracer()
            except ImportError as ex:
                _TRACER_FAILED = True
                log.warning(
                    "tracing is on, but the OpenTelemetry SDK is not installed "
                    "(pip install 'appliance[traces]'): %s",
                    ex,
                )
    return _TRACER


def _make_tracer() -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    url = _SETTINGS.url if _SETTINGS is not None else ""
    export_ms = _SETTINGS.export_ms if _SETTINGS is not None else 1000
    resource = Resource.create({"service.name": SERVICE, "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=url) if url else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=export_ms))
    atexit.register(provider.shutdown)
    return provider.get_tracer("appliance")


def context_of(traceparent: str | None) -> Any:
    """An OpenTelemetry context whose parent is ``traceparent`` (W3C), or the empty one."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not traceparent:
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def traceparent_of(span: Any) -> str:
    """The W3C traceparent naming ``span`` as the parent."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def span_at(name: str, parent: Any, start_ns: int, end_ns: int, **attributes: Any) -> Any:
    """A span already over, from ``start_ns`` to ``end_ns``, under ``parent`` (span or context)."""
    from opentelemetry import trace

    context = trace.set_span_in_context(parent) if hasattr(parent, "get_span_context") else parent
    span = tracer().start_span(name, context=context, start_time=start_ns, attributes=attributes)
    span.end(end_time=end_ns)
    return span


# -- a request in a frontend process ------------------------------------------------------


@dataclass(slots=True)
class RequestTrace:
    """One request's trace in its frontend: set when it arrives, spans once it is sampled."""

    protocol: str
    arrived_ns: int
    traceparent: str | None
    server: Any = None
    infer_start_ns: int = 0
    infer_end_ns: int = 0


REQUEST: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar(
    "request_trace", default=None
)


def begin_request(protocol: str, traceparent: Callable[[], str | None]) -> None:
    """Note a request's arrival (only while any tracing is on: it costs a clock read)."""
    current = _SETTINGS
    if current is None or not current.any_on():
        REQUEST.set(None)
        return
    REQUEST.set(RequestTrace(protocol, time.time_ns(), traceparent()))


def finish_request(status: str) -> None:
    """End a sampled request's server span, with its encode span, once it is answered."""
    request = REQUEST.get()
    if request is None or request.server is None:
        return
    with contextlib.suppress(Exception):
        now = time.time_ns()
        if request.infer_end_ns:
            span_at("encode", request.server, request.infer_end_ns, now)
        request.server.set_attribute("appliance.status", status)
        request.server.end(end_time=now)
    request.server = None


class CallTrace:
    """The ``infer`` span of one model call, with the request's server span made when sampled."""

    __slots__ = ("request", "span")

    def __init__(self, request: RequestTrace, span: Any) -> None:
        self.request = request
        self.span = span

    def end(self, error: str = "") -> None:
        with contextlib.suppress(Exception):
            if error:
                self.span.set_attribute("appliance.error", error[:256])
            self.request.infer_end_ns = time.time_ns()
            self.span.end(end_time=self.request.infer_end_ns)

    def step(self, model: str, index: int) -> tuple[StepTrace, str]:
        """Start the span of an ensemble's step under this call's; return it and its traceparent.

        The step's model worker puts its queue, compute and reply spans under
        it, as under a lone call's ``infer``.
        """
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        span = tracer().start_span(
            "infer",
            context=trace.set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes={"appliance.model": model, "appliance.ensemble_step": index},
        )
        return StepTrace(span), traceparent_of(span)


class StepTrace:
    """The ``infer`` span of one step of a traced ensemble call."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def end(self, error: str = "") -> None:
        with contextlib.suppress(Exception):
            if error:
                self.span.set_attribute("appliance.error", error[:256])
            self.span.end()


def start_call(model: str) -> tuple[CallTrace | None, str | None]:
    """Start tracing a model call when its request is sampled; return it and the traceparent.

    Returns (None, None) for a request that is not traced (the usual case: a
    contextvar read).
    """
    request = REQUEST.get()
    current = _SETTINGS
    if request is None or current is None or not current.sampled(model, request.traceparent):
        return None, None
    if tracer() is None:
        return None, None
    from opentelemetry.trace import SpanKind

    now = time.time_ns()
    if request.server is None:
        request.server = tracer().start_span(
            f"{request.protocol} {model}",
            context=context_of(request.traceparent),
            kind=SpanKind.SERVER,
            start_time=request.arrived_ns,
            attributes={"appliance.protocol": request.protocol, "appliance.model": model},
        )
        span_at("decode", request.server, request.arrived_ns, now)
    request.infer_start_ns = now
    from opentelemetry import trace

    span = tracer().start_span(
        "infer",
        context=trace.set_span_in_context(request.server),
        kind=SpanKind.CLIENT,
        start_time=now,
        attributes={"appliance.model": model},
    )
    return CallTrace(request, span), traceparent_of(span)
