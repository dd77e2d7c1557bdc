"""Per-request bookkeeping on the RPC transports (gRPC, MIP): protocol label, access line, metrics.

Each request is tagged with the protocol it came in by (the client API
records model calls under that label, see ``appliance/observability/metrics.py``); when it
is answered, the frontend counts it by wire status and writes one access
line (logger ``appliance.access``, on by default, ``server.access_log``).
HTTP's is observe_http.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from appliance.observability import tracing
from appliance.observability.metrics import MODEL, PROTOCOL, log_access
from appliance.protocols.grpc_server import Handler
from appliance.protocols.mip.service import MipService, status_of

_SERVICES = (
    ("/inference.", "kserve"),
    ("/grps.", "grps"),
    ("/grpc.health.", "health"),
    ("/org.pytorch.serve.", "torchserve"),
)


# grpc-stubs makes it generic; at run time it is a plain class.
if TYPE_CHECKING:
    Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
else:
    Context = grpc.aio.ServicerContext
# Makes a method's handler into another (the method's full name: /package.Service/Method).
Wrap = Callable[[Handler, str], Handler]


def observe_grpc(handler: Handler, method: str) -> Handler:
    """``handler``, its calls tagged, counted and logged under ``method``.

    Every behaviour on the grpc.aio server is a coroutine (unary answers)
    or an async generator (streamed answers); the observer wraps it in one
    of the same kind.
    """
    protocol = next((p for prefix, p in _SERVICES if method.startswith(prefix)), "grpc")
    wrap = _unary if not handler.response_streaming else _streaming
    return rebuild(handler, lambda behavior: wrap(behavior, protocol, method))


_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def rebuild(handler: Handler, replace: Callable[[Any], Any]) -> Handler:
    """A handler of the same kind and codecs whose behaviour is ``replace(behaviour)``."""
    for attribute, build in _KINDS:
        behavior = getattr(handler, attribute)
        if behavior is not None:
            built: Handler = build(
                replace(behavior),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
            return built
    return handler


def _code(context: Context) -> str:
    code: Any = context.code()  # None until the call ends or aborts
    if code is None:
        return "OK"
    return str(getattr(code, "name", code))


def _begin(protocol: str, context: Context) -> float:
    PROTOCOL.set(protocol)
    MODEL.set("")
    tracing.begin_request(protocol, lambda: _metadata(context, "traceparent"))
    return time.perf_counter()


def _metadata(context: Context, key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return str(value)
    return None


def _failed(context: Context) -> str:
    """The status of a call whose behaviour raised: what it aborted with, if it did."""
    return _code(context) if context.code() is not None else "UNKNOWN"


def _unary(behavior: Any, protocol: str, method: str) -> Any:
    async def observed(request: Any, context: Context) -> Any:
        started = _begin(protocol, context)
        status = "UNKNOWN"
        try:
            reply = await behavior(request, context)
            status = _code(context)
            return reply
        except BaseException:
            status = _failed(context)
            raise
        finally:
            log_access(protocol, status, started, method)
            tracing.finish_request(status)

    return observed


def _streaming(behavior: Any, protocol: str, method: str) -> Any:
    async def observed(request: Any, context: Context) -> AsyncIterator[Any]:
        started = _begin(protocol, context)
        status = "UNKNOWN"
        try:
            async for item in behavior(request, context):
                yield item
            status = _code(context)
        except BaseException:
            status = _failed(context)
            raise
        finally:
            log_access(protocol, status, started, method)
            tracing.finish_request(status)

    return observed


async def observe_mip(service: MipService, payload: bytes | bytearray) -> bytes:
    """One MIP inference, tagged, counted and logged, its reply frame returned.

    Each request runs as a task of its own, with its own copy of these tags:
    model calls count under "mip" (see appliance/observability/metrics.py).
    MIP frames carry no trace context: a sampled request starts its own trace.
    """
    PROTOCOL.set("mip")
    MODEL.set(service.model)
    tracing.begin_request("mip", _no_context)
    started = time.perf_counter()
    reply = await service.infer(payload)
    status = status_of(reply)
    log_access("mip", status, started, "inference")
    tracing.finish_request(status)
    return reply


def _no_context() -> None:
    return None
