"""UM-Bridge routes on the HTTP frontend.

SPEC: umbridge.md "Protocol" and PROTOCOL-FACTS §5.1, §5.5::

    GET  /Info                        {"protocolVersion": 1.0, "models": [...]}
    POST /ModelInfo                   {"support": {"Evaluate": b, "Gradient": b,
                                                   "ApplyJacobian": b, "ApplyHessian": b}}
    POST /InputSizes, /OutputSizes    {"inputSizes": [...]}, {"outputSizes": [...]}
    POST /Evaluate                    {"output": [[...], ...]}
    POST /Gradient, /ApplyJacobian, /ApplyHessian           {"output": [...]}
    POST /TestShMem                   {"value": [x]} or {}
    POST /EvaluateShMem, /GradientShMem, /ApplyJacobianShMem, /ApplyHessianShMem   {}

Bodies are JSON whatever the Content-Type (the conformity suite sends none).
Every reply, error or not, is ``application/json``; errors are rendered here,
inside the responders, so no other protocol's error form can leak in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import falcon

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError
from appliance.protocols.umbridge.bridge import Bridge
from appliance.protocols.umbridge.codec import Feature, decode_body
from appliance.protocols.umbridge.errors import (
    ErrorType,
    UmBridgeError,
    encode_error,
    from_appliance,
    invalid_input,
)
from appliance.protocols.web import App

# SAFETY: a JSON float64 takes up to ~25 bytes, so this admits vectors of
# about 2.5 million numbers; larger ones belong on the shared-memory side
# channel, which carries only names in its JSON.
MAX_BODY_BYTES = 64 << 20

log = logging.getLogger("appliance.umbridge")

Handler = Callable[[Mapping[str, Any]], bytes]


class InfoResource:
    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        respond(resp, self.bridge.info)


class PostResource:
    """One POST endpoint: read the body, run ``handler``, render the reply."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        respond(resp, lambda: self.handler(decode_body(read_body(req))))


def read_body(req: falcon.Request) -> bytes:
    """Return the whole body, refusing one above MAX_BODY_BYTES.

    Raises:
        UmBridgeError: 413 InvalidInput, the body is too large.
    """
    try:
        length = req.content_length
    except falcon.HTTPError:
        raise invalid_input("the Content-Length header is not a byte count") from None
    if length is None:
        chunked = "chunked" in (req.get_header("Transfer-Encoding") or "").lower()
        # Without a length or chunked framing an HTTP/1.1 request has no body.
        data = req.stream.read(MAX_BODY_BYTES + 1) if chunked else b""
    elif length > MAX_BODY_BYTES:
        raise _too_large(length)
    else:
        data = req.bounded_stream.read(length)
    if len(data) > MAX_BODY_BYTES:
        raise _too_large(len(data))
    return data


def _too_large(length: int) -> UmBridgeError:
    return UmBridgeError(
        413,
        ErrorType.INVALID_INPUT,
        f"the request body of {length} bytes exceeds the UM-Bridge limit of {MAX_BODY_BYTES} "
        "bytes; pass large vectors through shared memory (use_shmem=True)",
    )


def respond(resp: falcon.Response, produce: Callable[[], bytes]) -> None:
    """Set the reply from ``produce``, or UM-Bridge's error form if it raises."""
    try:
        body, status = produce(), 200
    except UmBridgeError as ex:
        body, status = encode_error(ex), ex.status
    except ApplianceError as ex:
        error = from_appliance(ex)
        body, status = encode_error(error), error.status
    except Exception as ex:
        log.exception("UM-Bridge request failed")
        error = UmBridgeError(500, "InternalError", f"internal error: {type(ex).__name__}: {ex}")
        body, status = encode_error(error), 500
    resp.status = falcon.code_to_http_status(status)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = body


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the UM-Bridge routes."""
    bridge = Bridge(client)
    app.add_route("/Info", InfoResource(bridge))
    app.add_route("/ModelInfo", PostResource(bridge.model_info))
    app.add_route("/InputSizes", PostResource(lambda r: bridge.sizes(r, outputs=False)))
    app.add_route("/OutputSizes", PostResource(lambda r: bridge.sizes(r, outputs=True)))
    app.add_route("/TestShMem", PostResource(bridge.test_shmem))
    for feature in Feature:
        for via_shm, suffix in ((False, ""), (True, "ShMem")):
            handler = _caller(bridge, feature, via_shm)
            app.add_route(f"/{feature}{suffix}", PostResource(handler))


def _caller(bridge: Bridge, feature: Feature, via_shm: bool) -> Handler:
    return lambda request: bridge.call(feature, request, via_shm)
