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
Every reply, error or not, is ``application/json``; errors are rendered here
(``web.guarded`` with :func:`failure`), so no other protocol's error form can
leak in.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import falcon

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError
from appliance.protocols.bodies import read_body
from appliance.protocols.umbridge.bridge import Bridge
from appliance.protocols.umbridge.codec import Feature, decode_body
from appliance.protocols.umbridge.errors import (
    UmBridgeError,
    encode_error,
    from_appliance,
)
from appliance.protocols.web import App, guarded

# SAFETY: a JSON float64 takes up to ~25 bytes, so http.max_body_bytes
# (64 MiB by default) admits vectors of about 2.5 million numbers; larger ones
# belong on the shared-memory side channel, which carries only names.
SHMEM_HINT = "pass large vectors through shared memory (use_shmem=True)"

log = logging.getLogger("appliance.umbridge")

Handler = Callable[[Mapping[str, Any]], bytes]
AsyncHandler = Callable[[Mapping[str, Any]], Awaitable[bytes]]


def _render_failure(_req: falcon.Request, resp: falcon.Response, error: Exception) -> None:
    render(resp, *failure(error))


_guarded = guarded(_render_failure)


class InfoResource:
    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    @_guarded
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        render(resp, self.bridge.info(), 200)


class _PostEndpoint:
    """A POST endpoint's body: JSON, within http.max_body_bytes."""

    def __init__(self, max_body_bytes: int) -> None:
        self.limit = max_body_bytes

    def request(self, req: falcon.Request) -> dict[str, Any]:
        return decode_body(read_body(req, self.limit, SHMEM_HINT))


class PostResource(_PostEndpoint):
    """One POST endpoint whose ``handler`` may block: it runs on the pool."""

    def __init__(self, handler: Handler, max_body_bytes: int) -> None:
        super().__init__(max_body_bytes)
        self.handler = handler

    @_guarded
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        render(resp, self.handler(self.request(req)), 200)


class ModelCallResource(_PostEndpoint):
    """Evaluate or a derivative: ``handler`` waits for the model in the event loop."""

    def __init__(self, handler: AsyncHandler, max_body_bytes: int) -> None:
        super().__init__(max_body_bytes)
        self.handler = handler

    @_guarded
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        render(resp, await self.handler(self.request(req)), 200)


def failure(error: Exception) -> tuple[bytes, int]:
    """UM-Bridge's error body and HTTP status for ``error``."""
    if isinstance(error, UmBridgeError):
        return encode_error(error), error.status
    if isinstance(error, ApplianceError):
        mapped = from_appliance(error)
        return encode_error(mapped), mapped.status
    log.error("UM-Bridge request failed", exc_info=error)
    internal = UmBridgeError(
        500, "InternalError", f"internal error: {type(error).__name__}: {error}"
    )
    return encode_error(internal), 500


def render(resp: falcon.Response, body: bytes, status: int) -> None:
    # Every reply, error or not, is JSON.
    resp.status = falcon.code_to_http_status(status)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = body


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the UM-Bridge routes."""
    bridge = Bridge(client)
    limit = client.config.http.max_body_bytes
    app.add_route("/Info", InfoResource(bridge))
    app.add_route("/ModelInfo", PostResource(bridge.model_info, limit))
    app.add_route("/InputSizes", PostResource(lambda r: bridge.sizes(r, outputs=False), limit))
    app.add_route("/OutputSizes", PostResource(lambda r: bridge.sizes(r, outputs=True), limit))
    app.add_route("/TestShMem", PostResource(bridge.test_shmem, limit))
    for via_shm, suffix in ((False, ""), (True, "ShMem")):
        for feature in Feature:
            handler = _caller(bridge, feature, via_shm)
            app.add_route(f"/{feature}{suffix}", ModelCallResource(handler, limit))


def _caller(bridge: Bridge, feature: Feature, via_shm: bool) -> AsyncHandler:
    if feature is Feature.EVALUATE:
        return lambda request: bridge.evaluate(request, via_shm)
    return lambda request: bridge.differentiate(feature, request, via_shm)
