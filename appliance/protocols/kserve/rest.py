"""KServe v2 REST routes (with Triton's extensions) on the HTTP frontend.

SPEC: PROTOCOL-FACTS §2.1 — health answers carry no body; clients decide on
the status code alone (200 yes; otherwise not). Not-ready answers 503 so that
load balancers, which treat any non-2xx as down, agree with tritonclient.
Every error is ``{"error": "<message>"}`` with the status of ``errors``.
tritonclient sends no Content-Type and reuses connections (§2.3), so no
route looks at Content-Type, and query parameters are ignored.

Routes (``{v}`` parts are optional; the demo models serve version "1")::

    GET  /v2 (or /v2/)                        server metadata
    GET  /v2/health/live | /v2/health/ready
    GET  /v2/models/{m}[/versions/{v}]        model metadata
    GET  .../ready | .../config | .../stats   model readiness, config, statistics
    POST .../infer                            inference (JSON and binary tensors)
    POST .../infer_stream                     the same, each response an SSE event (MLServer's)
    POST .../generate | .../generate_stream   MLServer's aliases of the two, or Triton's
                                              generate extension (generate.py)
    GET  /v2/models/stats                     statistics of every model
    POST /v2/repository/index                 POST .../models/{m}/load | unload
    GET  /v2/{system,cuda}sharedmemory[/region/{n}]/status
    POST /v2/{system,cuda}sharedmemory/region/{n}/register
    POST /v2/{system,cuda}sharedmemory[/region/{n}]/unregister
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

import falcon
import falcon.asgi
import orjson

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError, BadRequest, InternalError, Unsupported
from appliance.protocols.bodies import read_body
from appliance.protocols.jsonbody import load_object
from appliance.protocols.kserve import (
    codec,
    encoding,
    generate,
    infer,
    infer_stream,
    model_configuration,
    repository,
    service,
    statistics,
)
from appliance.protocols.kserve.errors import DecodeError, http_body, http_status
from appliance.protocols.kserve.inference import InferRequest, OutputData
from appliance.protocols.kserve.shm import RegionTable
from appliance.protocols.web import App, guarded, send_events

log = logging.getLogger("appliance.kserve")
JSON = "application/json"
BINARY = "application/octet-stream"
# What follows /v2/models/{m}[/versions/{v}]/; GET or POST, as each responder says.
SUFFIXES = ("ready", "config", "stats", "infer", "infer_stream", "generate", "generate_stream")


def _render_failure(req: falcon.Request, resp: falcon.Response, error: Exception) -> None:
    """Answer a failure as a KServe error body with its status."""
    if isinstance(error, ApplianceError):
        _render_error(resp, error, http_status(error))
    elif isinstance(error, falcon.HTTPError):
        _render_error(resp, DecodeError(error.description or error.title), error.status_code)
    else:
        log.error("KServe %s %s failed", req.method, req.path, exc_info=error)
        _render_error(resp, InternalError(f"internal error serving {req.path}"), 500)


responder = guarded(_render_failure)


def _render_error(resp: falcon.Response, error: ApplianceError, status: int) -> None:
    resp.status = status
    resp.content_type = JSON
    resp.data = http_body(error)
    for header in ("Inference-Header-Content-Length", "Content-Encoding"):
        resp.delete_header(header)


def _json(resp: falcon.Response, value: Any) -> None:
    resp.content_type = JSON
    resp.data = orjson.dumps(value)


class Resource:
    """Base of the KServe resources: the model client and shm registry."""

    def __init__(self, client: ModelClient, regions: RegionTable) -> None:
        self.client = client
        self.regions = regions
        self.limit = client.config.http.max_body_bytes
        self.compress_min = client.config.http.compress_min_bytes

    def body(self, req: falcon.Request) -> bytes:
        """Read the whole (decompressed) request body, within http.max_body_bytes."""
        data = read_body(req, self.limit)
        return encoding.decode_content(data, req.get_header("Content-Encoding"), self.limit)

    def json_body(self, req: falcon.Request) -> dict[str, Any]:
        """Read an optional JSON object body (tritonclient sometimes sends none)."""
        return load_object(self.body(req), DecodeError, empty_is_object=True)


# Health reads the status table (shared memory): answered in the loop, at once.
class LiveResource(Resource):
    async def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = falcon.HTTP_200 if self.client.server_live() else falcon.HTTP_503


class ReadyResource(Resource):
    async def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = falcon.HTTP_200 if self.client.server_ready() else falcon.HTTP_503


class ServerMetadataResource(Resource):
    @responder
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        _json(resp, service.server_metadata())


class ModelResource(Resource):
    """Everything under /v2/models/{model}[/versions/{version}]."""

    @responder
    def on_get(
        self, _req: falcon.Request, resp: falcon.Response, model: str, version: str = ""
    ) -> None:
        _json(resp, service.model_metadata(self.client, model, version))

    @responder
    def on_get_ready(
        self, _req: falcon.Request, resp: falcon.Response, model: str, version: str = ""
    ) -> None:
        ready = service.model_ready(self.client, model, version)
        resp.status = falcon.HTTP_200 if ready else falcon.HTTP_503

    @responder
    def on_get_config(
        self, _req: falcon.Request, resp: falcon.Response, model: str, version: str = ""
    ) -> None:
        _json(resp, model_configuration.model_config(self.client, model, version))

    @responder
    def on_get_stats(
        self, _req: falcon.Request, resp: falcon.Response, model: str = "", version: str = ""
    ) -> None:
        _json(resp, {"model_stats": statistics.model_statistics(self.client, model, version)})

    @responder
    async def on_post_infer(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str = ""
    ) -> None:
        request = codec.decode_infer_request(self.body(req), _header_length(req), model, version)
        await self._infer(req, resp, request)

    @responder
    async def on_post_infer_stream(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str = ""
    ) -> None:
        request = codec.decode_infer_request(self.body(req), _header_length(req), model, version)
        await self._infer_stream(resp, request)

    @responder
    async def on_post_generate(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str = ""
    ) -> None:
        """MLServer's ``generate``, its alias of ``infer``; Triton's generate extension
        (the body's keys are the model's inputs) where the body is no inference request."""
        await self._generate(req, resp, model, version, stream=False)

    @responder
    async def on_post_generate_stream(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str = ""
    ) -> None:
        """MLServer's ``generate_stream`` (``infer_stream``), or Triton's (see ``generate``)."""
        await self._generate(req, resp, model, version, stream=True)

    async def _infer(
        self, req: falcon.Request, resp: falcon.Response, request: InferRequest
    ) -> None:
        model = request.model
        timeout_s = request.timeout_s()
        accepted = encoding.choose_encoding(req.get_header("Accept-Encoding"))
        with await infer.infer_async(self.client, self.regions, request, timeout_s) as outputs:
            served = request.version or service.version_of(self.client, model)
            body, json_length = codec.encode_infer_response(model, served, request.id, outputs)
        if json_length is not None:
            resp.set_header("Inference-Header-Content-Length", str(json_length))
        resp.content_type = BINARY if json_length is not None else JSON
        if accepted is not None and len(body) >= self.compress_min:
            body = encoding.encode_content(body, accepted)
            resp.set_header("Content-Encoding", accepted)
        resp.data = body

    async def _infer_stream(self, resp: falcon.Response, request: InferRequest) -> None:
        """MLServer's ``infer_stream``: each response of the model as a server-sent event."""
        # An event is one line of JSON: no binary outputs.
        request.binary_output = False
        if request.outputs:
            request.outputs = [dataclasses.replace(o, binary=False) for o in request.outputs]
        served = request.version or service.version_of(self.client, request.model)
        await self._stream(resp, request, functools.partial(_encoded, request.model, served))

    async def _generate(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str, stream: bool
    ) -> None:
        """``generate`` (``stream``: ``generate_stream``) in the body's form: as ``infer``
        (``infer_stream``) for an inference request; else Triton's generate extension, the
        model's answer as one flat JSON object or each of its responses as an event."""
        body, header_length = self.body(req), _header_length(req)
        doc = generate.triton_form(body, header_length)
        if doc is None:
            request = codec.decode_infer_request(body, header_length, model, version)
            await (self._infer_stream(resp, request) if stream else self._infer(req, resp, request))
            return
        metadata = service.model_metadata(self.client, model, version)
        request = generate.decode_request(doc, metadata, model, version)
        served = request.version or service.version_of(self.client, model)
        encode = functools.partial(generate.encode_response, model, served)
        if stream:
            await self._stream(resp, request, encode)
            return
        timeout_s = request.timeout_s()
        if not infer_stream.decoupled(self.client, request.model):
            with await infer.infer_async(self.client, self.regions, request, timeout_s) as outputs:
                resp.data = encode(request.id, outputs)
            resp.content_type = JSON
            return
        parts = infer_stream.stream_async(self.client, self.regions, request, timeout_s)
        answers = [encode(request.id, outputs) async for outputs in parts]
        if len(answers) != 1:
            raise BadRequest(
                f"model {model} gave {len(answers)} responses to a generate request, which "
                "answers exactly one: use generate_stream for a model that streams"
            )
        resp.content_type = JSON
        resp.data = answers[0]

    async def _stream(self, resp: falcon.Response, request: InferRequest, encode: Encode) -> None:
        """Each response of the model as a server-sent event (``encode(id, outputs)``).

        A decoupled (streaming) model's every part is an event; any other model's one
        answer is the only event. Errors before the first part are answered as by
        ``infer``; one after it ends the stream with an event ``{"error": ...}``.
        """
        timeout_s = request.timeout_s()
        if not infer_stream.decoupled(self.client, request.model):
            with await infer.infer_async(self.client, self.regions, request, timeout_s) as outputs:
                body = encode(request.id, outputs)
            send_events(resp, infer_stream.events(body, None))
            return
        parts = infer_stream.stream_async(self.client, self.regions, request, timeout_s)
        try:
            # The first part before the status: a request the model refuses is an error reply.
            first = await anext(parts, None)
            answer: bytes | None = None
            if first is not None:
                answer = encode(request.id, first)
        except BaseException:
            await parts.aclose()
            raise
        send_events(resp, infer_stream.events(answer, parts, functools.partial(encode, request.id)))


# Encodes a response's outputs, given the request's id.
Encode = Callable[[str, list[OutputData]], bytes]


def _encoded(model: str, served: str, request_id: str, outputs: list[OutputData]) -> bytes:
    """A KServe response's JSON (no binary outputs)."""
    return codec.encode_infer_response(model, served, request_id, outputs)[0]


def _header_length(req: falcon.Request) -> int | None:
    value = req.get_header("Inference-Header-Content-Length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise DecodeError(
            f"Inference-Header-Content-Length must be a byte count, got {value!r}"
        ) from None


class RepositoryResource(Resource):
    """The model repository extension: index, load and unload (see repository.py)."""

    @responder
    def on_post_index(self, req: falcon.Request, resp: falcon.Response) -> None:
        ready = self.json_body(req).get("ready", False)
        _json(resp, repository.index(self.client, bool(ready)))

    @responder
    def on_post_load(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        parameters = self.json_body(req).get("parameters") or {}
        if not isinstance(parameters, dict):
            raise DecodeError("load parameters must be a JSON object")
        repository.load(self.client, model, parameters)
        _json(resp, {})

    @responder
    def on_post_unload(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        self.body(req)
        repository.unload(self.client, model)


class TraceResource(Resource):
    """The trace extension: GET and POST /v2[/models/{model}]/trace/setting."""

    @responder
    def on_get(self, _req: falcon.Request, resp: falcon.Response, model: str = "") -> None:
        _json(resp, self.client.trace_settings(model))

    @responder
    def on_post(self, req: falcon.Request, resp: falcon.Response, model: str = "") -> None:
        _json(resp, self.client.trace_settings(model, self.json_body(req)))


class SystemSharedMemoryResource(Resource):
    @responder
    def on_get_status(self, _req: falcon.Request, resp: falcon.Response, name: str = "") -> None:
        regions = self.regions.status(name or None)
        _json(resp, [region.status() for region in regions])

    @responder
    def on_post_register(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        body = self.json_body(req)
        key, offset, size = body.get("key"), body.get("offset", 0), body.get("byte_size")
        if not isinstance(key, str) or not isinstance(offset, int) or not isinstance(size, int):
            raise DecodeError('register needs {"key": str, "offset": int, "byte_size": int}')
        self.regions.register(name, key, offset, size)
        _json(resp, {})

    @responder
    def on_post_unregister(
        self, req: falcon.Request, resp: falcon.Response, name: str = ""
    ) -> None:
        self.body(req)
        self.regions.unregister(name or None)
        _json(resp, {})


class CudaSharedMemoryResource(Resource):
    @responder
    def on_get_status(self, _req: falcon.Request, resp: falcon.Response, name: str = "") -> None:
        regions = self.regions.cuda_status(name or None)
        _json(resp, [region.status() for region in regions])

    @responder
    def on_post_register(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        body = self.json_body(req)
        handle, size = body.get("raw_handle"), body.get("byte_size")
        device = body.get("device_id", 0)
        encoded = handle.get("b64") if isinstance(handle, dict) else None
        if not isinstance(encoded, str) or not isinstance(device, int) or not isinstance(size, int):
            raise DecodeError(
                'register needs {"raw_handle": {"b64": str}, "device_id": int, "byte_size": int}'
            )
        try:
            raw = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise DecodeError("raw_handle.b64 is not base64") from None
        self.regions.register_cuda(name, raw, device, size)
        _json(resp, {})

    @responder
    def on_post_unregister(
        self, req: falcon.Request, resp: falcon.Response, name: str = ""
    ) -> None:
        # SPEC: PROTOCOL-FACTS §2.7 — the shm examples unregister CUDA regions
        # first; with none registered (a CPU-only server) that succeeds too.
        self.body(req)
        self.regions.unregister(name or None, "cuda")
        _json(resp, {})


async def unknown_endpoint(
    req: falcon.Request, resp: falcon.Response | None, **_params: Any
) -> None:
    """Answer /v2 paths no route serves (trace and log settings, typos) in KServe's form."""
    if resp is None:  # a WebSocket: falcon refuses it
        return
    error = Unsupported(f"{req.method} {req.path} is not an endpoint this server implements")
    _render_error(resp, error, 404)


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the KServe v2 REST routes."""
    regions = RegionTable(client.tree.dir, client.config.shm.cuda_copies, client.open_region)
    metadata = ServerMetadataResource(client, regions)
    app.add_route("/v2", metadata)
    app.add_route("/v2/", metadata)  # SPEC: the OIP REST yaml spells it with the slash
    app.add_route("/v2/health/live", LiveResource(client, regions))
    app.add_route("/v2/health/ready", ReadyResource(client, regions))
    model = ModelResource(client, regions)
    app.add_route("/v2/models/stats", model, suffix="stats")
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.add_route(base, model)
        for suffix in SUFFIXES:
            app.add_route(f"{base}/{suffix}", model, suffix=suffix)
    trace = TraceResource(client, regions)
    app.add_route("/v2/trace/setting", trace)
    app.add_route("/v2/models/{model}/trace/setting", trace)
    repository = RepositoryResource(client, regions)
    app.add_route("/v2/repository/index", repository, suffix="index")
    app.add_route("/v2/repository/models/{model}/load", repository, suffix="load")
    app.add_route("/v2/repository/models/{model}/unload", repository, suffix="unload")
    for kind, resource in (
        ("system", SystemSharedMemoryResource(client, regions)),
        ("cuda", CudaSharedMemoryResource(client, regions)),
    ):
        base = f"/v2/{kind}sharedmemory"
        app.add_route(f"{base}/status", resource, suffix="status")
        app.add_route(f"{base}/region/{{name}}/status", resource, suffix="status")
        app.add_route(f"{base}/region/{{name}}/register", resource, suffix="register")
        app.add_route(f"{base}/unregister", resource, suffix="unregister")
        app.add_route(f"{base}/region/{{name}}/unregister", resource, suffix="unregister")
    app.add_sink(unknown_endpoint, prefix=r"/v2/")
