"""TorchServe's inference API on the HTTP frontend (its management API: management.py).

SPEC: TorchServe 0.12's frontend (docs/models/torchserve.md lists what differs)::

    GET  /ping                                   {"status": "Healthy"} or 500 "Unhealthy"
    POST /predictions/{model}[/{version}[/...]]  the handler's answer (PUT too: curl -T)
    POST /explanations/{model}[/{version}]       the same, with the header explain: True
    POST /v1/models/{model}:predict, :explain    the same (KServe v1's paths)
    POST /invocations[?model_name=], /models/{model}/invoke, /{model}/predict
                                                 the same, the query's parameters as fields

A model's answer is its handler's body, with the status, content type and
headers the handler set; a failure is TorchServe's ``{"code", "type",
"message"}`` (errors.py). Every answer carries ``x-request-id`` and
TorchServe's no-cache headers.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import falcon

from appliance.client.api import ModelClient
from appliance.core.http_body import CONTENT_TYPE, HEADERS, REASON, STATUS
from appliance.protocols.bodies import read_body
from appliance.protocols.torchserve.answers import common_headers, guarded_json, json_answer
from appliance.protocols.torchserve.errors import TorchServeError, pretty
from appliance.protocols.torchserve.predict import answers, model_metadata
from appliance.protocols.torchserve.request import read_call
from appliance.protocols.web import App

log = logging.getLogger("appliance.torchserve")


class Ping:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @guarded_json
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        healthy = self.client.server_ready()
        status = "Healthy" if healthy else "Unhealthy"
        json_answer(resp, pretty({"status": status}), 200 if healthy else 500)


class Predictions:
    """A model's answer to one request: its handler's body, status and headers."""

    def __init__(self, client: ModelClient, explain: bool) -> None:
        self.client = client
        self.explain = explain
        self.limit = client.config.http.max_body_bytes
        # Whether the query's parameters are fields (TorchServe's legacy paths).
        self.query = False

    @guarded_json
    async def on_post(
        self,
        req: falcon.Request,
        resp: falcon.Response,
        model: str,
        version: str | None = None,
        rest: str = "",
    ) -> None:
        await self._answer(req, resp, model, version, rest)

    async def _answer(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str | None, rest: str
    ) -> None:
        metadata = model_metadata(self.client, model, version)
        body = read_body(req, self.limit)
        headers = {str(key).lower(): str(value) for key, value in req.headers.items()}
        query = None
        if self.query:  # a repeated parameter is each of its values, as TorchServe adds them
            query = [
                (name, value)
                for name, given in req.params.items()
                for value in (given if isinstance(given, list) else [given])
            ]
        call = read_call(body, headers, rest, self.explain, query)
        request_id = str(uuid.uuid4())
        resp.set_header("x-request-id", request_id)
        parts = answers(self.client, metadata, call, request_id)
        try:
            data, said = await anext(parts)
        except BaseException:
            await parts.aclose()
            raise
        _head(resp, said)
        if not metadata.supports.get("predict_stream"):
            await parts.aclose()
            resp.data = data
            return

        async def chunks() -> AsyncIterator[bytes]:
            # The first part's status and headers are the response's, as TorchServe
            # sends a stream; the rest go as chunks as they come.
            try:
                yield data
                async for more, _ in parts:
                    yield more
            except Exception as ex:
                # The status is sent: the stream ends where the handler failed.
                log.warning("model %s: its stream ended early: %s", model, ex)
            finally:
                await parts.aclose()

        resp.stream = chunks()  # type: ignore[assignment]  # ASGI: an async iterator

    # TorchServe runs the handler whatever the method (curl -T sends PUT).
    on_put = on_get = on_delete = on_post


def _head(resp: falcon.Response, said: dict[str, Any]) -> None:
    """The status, content type and headers the handler set."""
    status = int(said.get(STATUS, 200))
    reason = said.get(REASON)
    resp.status = f"{status} {reason}" if reason else falcon.code_to_http_status(status)
    content_type = said.get(CONTENT_TYPE)
    resp.content_type = str(content_type) if content_type else None
    given = said.get(HEADERS)
    if isinstance(given, dict):
        for key, value in given.items():
            resp.set_header(str(key), str(value))
    common_headers(resp)


class Legacy(Predictions):
    """TorchServe's older inference paths: the query's parameters are fields too, and
    /invocations names its model in ``model_name`` (or serves the only model)."""

    def __init__(self, client: ModelClient) -> None:
        super().__init__(client, False)
        self.query = True

    @guarded_json
    async def on_post(
        self, req: falcon.Request, resp: falcon.Response, model: str | None = None
    ) -> None:
        name = model or req.get_param("model_name")
        if not name:
            served = self.client.models()
            if len(served) != 1:
                raise TorchServeError(
                    400, "BadRequestException", "Parameter model_name is required."
                )
            name = served[0]
        await self._answer(req, resp, name, None, "")

    on_put = on_get = on_post


def add_routes(app: App, client: ModelClient) -> None:
    """Mount TorchServe's inference routes."""
    app.add_route("/ping", Ping(client))
    for prefix, explain in (("/predictions", False), ("/explanations", True)):
        resource = Predictions(client, explain)
        app.add_route(f"{prefix}/{{model}}", resource)
        app.add_route(f"{prefix}/{{model}}/{{version}}", resource)
        app.add_route(f"{prefix}/{{model}}/{{version}}/{{rest:path}}", resource)
    # KServe v1's paths, which TorchServe routes to the same handler (its body as it is).
    app.add_route("/v1/models/{model}:predict", Predictions(client, False))
    app.add_route("/v1/models/{model}:explain", Predictions(client, True))
    legacy = Legacy(client)
    app.add_route("/invocations", legacy)
    app.add_route("/models/{model}/invoke", legacy)
    app.add_route("/{model}/predict", legacy)
