"""Per-request bookkeeping of the HTTP frontend: protocol label, access line, metrics.

Each request is tagged with the protocol it came in by, from its path (the
client API records model calls under that label, see
``appliance/observability/metrics.py``); when it is answered, the frontend
counts it by wire status and writes one access line (logger
``appliance.access``, on by default, ``server.access_log``). The RPC
transports' is observe.py.

Compiled with the request path (appliance/native.py).
"""

from __future__ import annotations

import time

import falcon

from appliance.observability import tracing
from appliance.observability.metrics import MODEL, PROTOCOL, log_access

# UM-Bridge's routes are the only ones that start with a capital letter.
_PREFIXES = (
    ("/v2", "kserve"),
    ("/grps/", "grps"),
    ("/graphpipe", "graphpipe"),
    ("/predictions/", "torchserve"),
    ("/explanations/", "torchserve"),
    ("/models", "torchserve"),
    ("/v1/models/", "torchserve"),
    ("/ping", "torchserve"),
    ("/token", "torchserve"),
)


def protocol_of_path(method: str, path: str, openai_prefix: str = "/v1/") -> str:
    """Which protocol an HTTP request speaks, from its path (``openai_prefix``: where
    OpenAI's routes are, ending in "/"; TorchServe's KServe v1 paths have a colon)."""
    if path.startswith(openai_prefix) and ":" not in path:
        return "openai"
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

    def __init__(self, openai_prefix: str = "/v1") -> None:
        self.openai_prefix = openai_prefix.rstrip("/") + "/"

    async def process_request(self, req: falcon.Request, _resp: falcon.Response) -> None:
        protocol = protocol_of_path(req.method, req.path, self.openai_prefix)
        PROTOCOL.set(protocol)
        MODEL.set("")
        req.context.protocol = protocol
        req.context.started = time.perf_counter()
        tracing.begin_request(protocol, lambda: req.get_header("traceparent"))

    async def process_response(
        self, req: falcon.Request, resp: falcon.Response, _resource: object, _ok: bool
    ) -> None:
        started = getattr(req.context, "started", None)
        if started is not None:
            ran = getattr(req.context, "call_context", None)
            if ran is not None:
                # A blocking responder called the model in a thread (protocols/web.py).
                MODEL.set(ran.get(MODEL, ""))
            status = str(resp.status).split(" ", 1)[0]
            log_access(req.context.protocol, status, started, f"{req.method} {req.path}")
            tracing.finish_request(status)
