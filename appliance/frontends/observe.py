"""Per-request bookkeeping on every transport: protocol label, access line, metrics.

Each request is tagged with the protocol it came in by (the client API
records model calls under that label, see ``appliance/metrics.py``); when it
is answered, the frontend counts it by wire status and writes one access
line (logger ``appliance.access``, on by default, ``server.access_log``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

import falcon
import grpc

from appliance.metrics import MODEL, PROTOCOL, log_access

# UM-Bridge's routes are the only ones that start with a capital letter.
_PREFIXES = (("/v2", "kserve"), ("/grps/", "grps"), ("/graphpipe", "graphpipe"))
_SERVICES = (("/inference.", "kserve"), ("/grps.", "grps"), ("/grpc.health.", "health"))


def protocol_of_path(method: str, path: str) -> str:
    """Which protocol an HTTP request speaks, from its path."""
    for prefix, protocol in _PREFIXES:
        if path.startswith(prefix):
            return protocol
    if path in ("/metrics", "/favicon.ico"):
        return "http"
    if path == "/":
        return "graphpipe" if method == "POST" else "page"
    if len(path) > 1 and path[1].isupper():
        return "umbridge"
    return "http"


class HttpObserver:
    """falcon middleware: tag, count and log every HTTP request."""

    def process_request(self, req: falcon.Request, _resp: falcon.Response) -> None:
        protocol = protocol_of_path(req.method, req.path)
        PROTOCOL.set(protocol)
        MODEL.set("")
        req.context.protocol = protocol
        req.context.started = time.perf_counter()

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, _resource: object, _ok: bool
    ) -> None:
        started = getattr(req.context, "started", None)
        if started is not None:
            status = str(resp.status).split(" ", 1)[0]
            log_access(req.context.protocol, status, started, f"{req.method} {req.path}")


# grpc-stubs makes these generic; at run time they are plain classes.
if TYPE_CHECKING:
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    Interceptor: TypeAlias = grpc.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    Interceptor = grpc.ServerInterceptor


class GrpcObserver(Interceptor):
    """A server interceptor: tag, count and log every RPC."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
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


def _code(context: grpc.ServicerContext) -> str:
    code = context.code()  # type: ignore[attr-defined]
    return "OK" if code is None else str(code.name)


def _begin(protocol: str) -> float:
    PROTOCOL.set(protocol)
    MODEL.set("")
    return time.perf_counter()


def _unary(behavior: Any, protocol: str, method: str) -> Any:
    def observed(request: Any, context: grpc.ServicerContext) -> Any:
        started = _begin(protocol)
        status = "UNKNOWN"
        try:
            reply = behavior(request, context)
            status = _code(context)
            return reply
        except Exception:
            status = _code(context) if context.code() else "UNKNOWN"  # type: ignore[attr-defined]
            raise
        finally:
            log_access(protocol, status, started, method)

    return observed


def _streaming(behavior: Any, protocol: str, method: str) -> Any:
    def observed(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        started = _begin(protocol)
        status = "UNKNOWN"
        try:
            yield from behavior(request, context)
            status = _code(context)
        except Exception:
            status = _code(context) if context.code() else "UNKNOWN"  # type: ignore[attr-defined]
            raise
        finally:
            log_access(protocol, status, started, method)

    return observed
