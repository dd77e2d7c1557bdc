"""GraphPipe over HTTP: ``/`` (the default model) and ``/graphpipe/{model}``.

SPEC: specs/graphpipe.md §4 and PROTOCOL-FACTS §1.2 — a POST body is a
flatbuffer ``Request`` (no Content-Type needed); an InferRequest gets an
InferResponse, any other Request a MetadataResponse; a GET answers the
metadata as JSON. ``GET /`` from a browser (Accept: text/html) gets the
host's page instead, when the frontend hands one in (``home_page``). A body
that is not a Request gets HTTP 400 text/plain; a request that decodes but
fails gets an InferResponse with ``errors``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import falcon
from flatbuffers.builder import BuilderSizeError

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError, ModelNotFound
from appliance.protocols.bodies import read_body
from appliance.protocols.graphpipe.bind import bind, select_outputs
from appliance.protocols.graphpipe.codec import (
    decode_request,
    encode_error_response,
    encode_infer_response,
    encode_metadata_response,
)
from appliance.protocols.graphpipe.errors import (
    DecodeError,
    GraphPipeCode,
    GraphPipeError,
    from_appliance,
    http_status,
)
from appliance.protocols.graphpipe.request import InferRequest, MetadataRequest
from appliance.protocols.graphpipe.wire import MetadataInfo, describe, metadata_json
from appliance.protocols.page import wants_html
from appliance.protocols.web import App, guarded

# Renders the page a browser gets at GET / (the frontend hands in the dashboard).
HomePage = Callable[[ModelClient], str]

log = logging.getLogger("appliance.graphpipe")

FLATBUFFER_TYPE = "application/octet-stream"


class _TextError(Exception):
    """An answer in plain text with an HTTP status, for what no flatbuffer carries."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _render_failure(req: falcon.Request, resp: falcon.Response, error: Exception) -> None:
    """Answer a failure as GraphPipe's reference server does: plain text."""
    if isinstance(error, _TextError):
        _text(resp, error.status, error.message)
    elif isinstance(error, ApplianceError):
        _text(resp, http_status(error), error.message)
    else:
        log.error("graphpipe %s %s failed", req.method, req.path, exc_info=error)
        _text(resp, falcon.HTTP_500, "graphpipe: internal error; see the appliance log")


_guarded = guarded(_render_failure)


def _text(resp: falcon.Response, status: str, message: str) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_TEXT
    resp.text = message + "\n"


class GraphPipeResource:
    """One model's GraphPipe endpoint; the default model when none is routed."""

    def __init__(self, client: ModelClient, home_page: HomePage | None = None) -> None:
        self.client = client
        self.home_page = home_page

    @_guarded
    def on_get(self, req: falcon.Request, resp: falcon.Response, model: str = "") -> None:
        if not model and self.home_page is not None and wants_html(req.accept):
            resp.content_type = falcon.MEDIA_HTML
            resp.text = self.home_page(self.client)
            return
        resp.content_type = falcon.MEDIA_JSON
        resp.data = metadata_json(self._describe(model))

    @_guarded
    async def on_post(self, req: falcon.Request, resp: falcon.Response, model: str = "") -> None:
        body = read_body(req, self.client.config.http.max_body_bytes)
        try:
            request = decode_request(body)
        except DecodeError as ex:
            raise _TextError(falcon.HTTP_400, f"graphpipe: malformed request: {ex}") from None
        resp.content_type = FLATBUFFER_TYPE
        if isinstance(request, MetadataRequest):
            resp.data = encode_metadata_response(self._describe(model))
        else:
            resp.data = await self._infer(model, request)

    async def _infer(self, model: str, request: InferRequest) -> bytes:
        try:
            model = model or self._default_model()
            metadata = self.client.metadata(model)
            binding = bind(metadata, request)
            result = await self.client.infer_async(
                model, binding.inputs, binding.outputs, binding.parameters
            )
            with result:
                outputs = select_outputs(metadata, binding.outputs, result.outputs)
                return encode_infer_response(outputs)
        except GraphPipeError as ex:
            return encode_error_response(ex)
        except ApplianceError as ex:
            return encode_error_response(from_appliance(ex))
        except BuilderSizeError:
            return encode_error_response(
                GraphPipeError(
                    GraphPipeCode.TOO_LARGE,
                    f"model {model}: the reply exceeds a flatbuffer's 2 GiB limit",
                )
            )

    def _describe(self, model: str) -> MetadataInfo:
        return describe(self.client.metadata(model or self._default_model()))

    def _default_model(self) -> str:
        config = self.client.config
        name = config.http.graphpipe_model or config.server.default_model
        if not name:
            raise ModelNotFound(
                "no default model is configured (http.graphpipe_model or server.default_model); "
                "use /graphpipe/<model> for one of: " + ", ".join(self.client.models())
            )
        return name


def add_routes(app: App, client: ModelClient, home_page: HomePage | None = None) -> None:
    """Mount GraphPipe at ``/`` (the default model) and ``/graphpipe/{model}``.

    Clients POST to exactly the URL they are given (PROTOCOL-FACTS §1.2), so
    a trailing slash is accepted too. ``home_page`` renders what a browser's
    GET / shows instead of the default model's metadata.
    """
    resource = GraphPipeResource(client, home_page)
    app.add_route("/", resource)
    app.add_route("/graphpipe/{model}", resource)
    app.add_route("/graphpipe/{model}/", resource)
