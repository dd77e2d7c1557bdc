"""GRPS REST routes on the HTTP frontend, under /grps/v1.

SPEC: grps.md "RESTful接口" and PROTOCOL-FACTS §3.2::

    GET|POST /grps/v1/health/online, /health/offline   flip the host's online flag
    GET|POST /grps/v1/health/live                      always 200 while serving
    GET|POST /grps/v1/health/ready                     200, or 503 FAILURE when not ready
    POST     /grps/v1/infer/predict[?model=&streaming=true&return-ndarray=true]
    GET|POST /grps/v1/metadata/server                  YAML in str_data
    POST     /grps/v1/metadata/model  {"str_data": name}   YAML in str_data
    GET      /grps/v1/monitor/metrics                  JSON for the page at GET /

Every reply carries GRPS's status object; the HTTP status equals
``status.code``, as in GRPS's Python server. Errors are rendered here,
inside the responders, so no other protocol's error form can leak in.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import falcon
import falcon.asgi
import orjson

from appliance.client.api import ModelClient
from appliance.protocols import page
from appliance.protocols.bodies import read_body
from appliance.protocols.grps import service
from appliance.protocols.grps.codec import (
    BINARY_TYPE,
    JSON_TYPE,
    REPLY_TYPE,
    decode_json_request,
    encode_error,
    encode_json_reply,
    encode_status,
)
from appliance.protocols.grps.errors import OK, GrpsError, bad_request
from appliance.protocols.grps.payload import Kind, Payload
from appliance.protocols.jsonbody import load_object
from appliance.protocols.web import App, guarded

ROOT = "/grps/v1"
# Query parameters GRPS itself reads; the others reach the model as parameters.
RESERVED_PARAMS = ("model", "streaming", "return-ndarray")
# SPEC: PROTOCOL-FACTS §3.2 — GRPS's default streaming response content type.
STREAM_TYPE = BINARY_TYPE


def _render_failure(_req: falcon.Request, resp: falcon.Response, error: Exception) -> None:
    """Answer a failure as a GRPS status (service.failure logs the unexpected)."""
    failure = service.failure(error)
    reply(resp, failure.code, encode_error(failure))


_guarded = guarded(_render_failure)


def reply(resp: falcon.Response, code: int, body: bytes, content_type: str = REPLY_TYPE) -> None:
    resp.status = falcon.code_to_http_status(code)
    resp.content_type = content_type
    resp.data = body


class OnlineResource:
    def __init__(self, client: ModelClient, online: bool) -> None:
        self.client = client
        self.online = online

    @_guarded
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        service.set_online(self.client, self.online)
        reply(resp, OK, encode_status())

    on_post = on_get


class LiveResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    async def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        # Answering at all means this frontend lives; the master must too.
        if self.client.server_live():
            reply(resp, OK, encode_status())
        else:
            reply(resp, 503, encode_status(503, service.UNAVAILABLE))

    on_post = on_get


class ReadyResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    async def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        if service.ready(self.client):
            reply(resp, OK, encode_status())
        else:
            reply(resp, 503, encode_status(503, service.UNAVAILABLE))

    on_post = on_get


class ServerMetadataResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        reply(resp, OK, encode_status(str_data=service.server_metadata(self.client)))

    on_post = on_get


class ModelMetadataResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = read_body(req, self.client.config.http.max_body_bytes)
        name = load_object(body, bad_request, empty_is_object=True, what="the body").get("str_data")
        if not isinstance(name, str) or not name:
            raise bad_request('No model name: POST {"str_data": "<model name>"}')
        yaml_text = service.model_metadata(self.client, name)
        reply(resp, OK, encode_status(str_data=yaml_text))

    @_guarded
    def on_get(self, _req: falcon.Request, _resp: falcon.Response) -> None:
        raise GrpsError(405, 'metadata/model takes POST {"str_data": "<model name>"}')


class PredictResource:
    """POST /grps/v1/infer/predict, plain or streaming."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    def on_get(self, _req: falcon.Request, _resp: falcon.Response) -> None:
        raise GrpsError(405, "infer/predict takes POST with a JSON or octet-stream body")

    @_guarded
    async def on_post(self, req: falcon.Request, resp: falcon.asgi.Response) -> None:
        streaming = _flag(req, "streaming")
        want_ndarray = _flag(req, "return-ndarray")
        if streaming and want_ndarray:
            raise bad_request("streaming=true and return-ndarray=true cannot be used together")
        payload = decode_body(req, self.client.config.http.max_body_bytes)
        # SPEC: grps.md "模型选择" — the payload's model wins over ?model=.
        payload.model = payload.model or req.get_param("model") or ""
        pairs = [(k, v if isinstance(v, str) else v[-1]) for k, v in req.params.items()]
        parameters = service.parameters(pairs, RESERVED_PARAMS)
        if streaming:
            await self._stream(resp, payload, parameters)
            return
        body, content_type = await service.predict_async(
            self.client, payload, parameters, _encode, want_ndarray=want_ndarray
        )
        reply(resp, OK, body, content_type)

    async def _stream(
        self, resp: falcon.asgi.Response, payload: Payload, parameters: dict[str, Any]
    ) -> None:
        parts = service.stream_async(self.client, payload, parameters, encode_json_reply)
        # The first part decides the HTTP status: errors found before any
        # output (model, binding, the worker's checks) get a plain reply.
        try:
            first = await anext(parts)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await parts.aclose()
            raise
        resp.status = falcon.HTTP_200
        resp.content_type = STREAM_TYPE
        resp.stream = _Chunks(first, parts)


def _encode(payload: Payload) -> tuple[bytes, str]:
    # SPEC: grps.md "RESTful接口" — bin_data replies are the raw body.
    if payload.kind is Kind.BIN_DATA:
        assert isinstance(payload.data, bytes)
        return payload.data, BINARY_TYPE
    return encode_json_reply(payload), REPLY_TYPE


class _Chunks:
    """One GrpsMessage per HTTP chunk; a failure ends the stream as one.

    falcon closes a response stream that has ``close()`` when the response
    ends, the client gone or not; closing ``parts`` cancels the model's
    stream in its worker.
    """

    def __init__(self, first: bytes | None, parts: AsyncGenerator[bytes, None]) -> None:
        self._parts = parts
        self._chunks = self._run(first)

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        return await anext(self._chunks)

    async def _run(self, first: bytes | None) -> AsyncGenerator[bytes, None]:
        try:
            if first is not None:
                yield first
            async for part in self._parts:
                yield part
        except Exception as ex:
            yield encode_error(service.failure(ex))

    async def close(self) -> None:
        await self._chunks.aclose()
        await self._parts.aclose()


def _flag(req: falcon.Request, name: str) -> bool:
    return (req.get_param(name) or "").lower() == "true"


def decode_body(req: falcon.Request, limit: int) -> Payload:
    """Return the request's payload from a JSON or octet-stream body.

    SPEC: PROTOCOL-FACTS §3.2 — the Content-Type must be exactly one of the
    two; the body must not be empty.
    """
    content_type = req.content_type
    if not content_type:
        raise bad_request(
            f"No content type in headers: send Content-Type {JSON_TYPE} or {BINARY_TYPE}"
        )
    if content_type not in (JSON_TYPE, BINARY_TYPE):
        raise bad_request(
            f"Unsupported content type {content_type!r}: GRPS predict takes exactly "
            f"{JSON_TYPE} or {BINARY_TYPE}"
        )
    body = read_body(req, limit)
    if not body:
        raise bad_request("The http body is empty.")
    if content_type == BINARY_TYPE:
        return Payload(Kind.BIN_DATA, data=body)
    return decode_json_request(body)


class MonitorResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        resp.cache_control = ["no-store"]
        reply(resp, OK, orjson.dumps(page.snapshot(self.client)), falcon.MEDIA_JSON)


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the GRPS REST routes."""
    app.add_route(f"{ROOT}/health/online", OnlineResource(client, online=True))
    app.add_route(f"{ROOT}/health/offline", OnlineResource(client, online=False))
    app.add_route(f"{ROOT}/health/live", LiveResource(client))
    app.add_route(f"{ROOT}/health/ready", ReadyResource(client))
    app.add_route(f"{ROOT}/infer/predict", PredictResource(client))
    app.add_route(f"{ROOT}/metadata/server", ServerMetadataResource(client))
    app.add_route(f"{ROOT}/metadata/model", ModelMetadataResource(client))
    app.add_route(page.MONITOR_PATH, MonitorResource(client))
