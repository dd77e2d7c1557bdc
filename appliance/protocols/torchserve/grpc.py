"""TorchServe's gRPC services: inference (org.pytorch.serve.grpc.inference.InferenceAPIsService)
and management (org.pytorch.serve.grpc.management.ManagementAPIsService).

SPEC: TorchServe 0.12's InferenceImpl, ManagementImpl and GRPCUtils. A
request's ``input`` map is its fields (the handler's data item, each value
bytes, no content type, as TorchServe passes them); the answer is the
handler's body as ``prediction``. Failures end the call with the gRPC
status TorchServe gives the HTTP status (404 NOT_FOUND, 503 UNAVAILABLE,
400 INVALID_ARGUMENT, 409 ABORTED, other 5xx INTERNAL, other 4xx
FAILED_PRECONDITION) and the message as its details. Management answers
carry the REST API's JSON in ``msg``.

Both services are on the appliance's gRPC port, and on its second one
(``grpc.management_port``, 7071 for a model store), where TorchServe serves
management.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from appliance._generated import (
    torchserve_inference_pb2,
    torchserve_inference_pb2_grpc,
    torchserve_management_pb2,
    torchserve_management_pb2_grpc,
)
from appliance.client.api import ModelClient
from appliance.protocols.grpc_server import GrpcServer
from appliance.protocols.threads import Threads
from appliance.protocols.torchserve import management
from appliance.protocols.torchserve.errors import TorchServeError, from_error, pretty
from appliance.protocols.torchserve.predict import answers, model_metadata
from appliance.protocols.torchserve.request import fields_call

Context = grpc.aio.ServicerContext[Any, Any]
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    416: grpc.StatusCode.OUT_OF_RANGE,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(http_status: int) -> grpc.StatusCode:
    """The gRPC status TorchServe gives an HTTP status."""
    if http_status in _CODES:
        return _CODES[http_status]
    if 200 <= http_status < 300:
        return grpc.StatusCode.OK
    if 400 <= http_status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    if 500 <= http_status < 600:
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.UNKNOWN


async def _abort(context: Context, error: Exception) -> None:
    failure = from_error(error)
    await context.abort(status_code(failure.status), failure.message)


class InferenceServicer(torchserve_inference_pb2_grpc.InferenceAPIsServiceServicer):  # type: ignore[misc]
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    async def Ping(self, request: Any, context: Context) -> Any:
        healthy = self.client.server_ready()
        text = pretty({"status": "Healthy" if healthy else "Unhealthy"}).decode().rstrip("\n")
        return torchserve_inference_pb2.TorchServeHealthResponse(health=text)

    async def Predictions(self, request: Any, context: Context) -> Any:
        """The handler's answer (a handler that streams: its parts, joined)."""
        bodies = []
        try:
            async for body in self._answers(request):
                bodies.append(body)
        except Exception as ex:
            await _abort(context, ex)
        return torchserve_inference_pb2.PredictionResponse(prediction=b"".join(bodies))

    async def StreamPredictions(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """Each part of a streaming handler's answer as it comes (one for the others)."""
        try:
            async for body in self._answers(request):
                yield torchserve_inference_pb2.PredictionResponse(prediction=body)
        except Exception as ex:
            await _abort(context, ex)

    async def StreamPredictions2(self, request_iterator: Any, context: Context) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "StreamPredictions2 (sequences over one stream) is not served; call "
            "StreamPredictions per request",
        )

    async def _answers(self, request: Any) -> AsyncIterator[bytes]:
        if not request.model_name:
            raise TorchServeError(400, "BadRequestException", "Parameter model_name is required.")
        version = request.model_version or None
        metadata = model_metadata(self.client, request.model_name, version)
        call = fields_call(dict(request.input))
        parts = answers(self.client, metadata, call, str(uuid.uuid4()))
        try:
            async for body, _said in parts:
                yield body
        finally:
            await parts.aclose()


class ManagementServicer(torchserve_management_pb2_grpc.ManagementAPIsServiceServicer):  # type: ignore[misc]
    def __init__(self, client: ModelClient, threads: Threads) -> None:
        self.client = client
        self.threads = threads

    async def DescribeModel(self, request: Any, context: Context) -> Any:
        version = request.model_version or None
        return await self._run(
            context, lambda: management.describe(self.client, request.model_name, version)
        )

    async def ListModels(self, request: Any, context: Context) -> Any:
        params = {"limit": request.limit or None, "next_page_token": request.next_page_token}
        return await self._run(context, lambda: management.list_models(self.client, params))

    async def RegisterModel(self, request: Any, context: Context) -> Any:
        params = {
            "url": request.url,
            "model_name": request.model_name,
            "initial_workers": request.initial_workers,
            "batch_size": request.batch_size,
            "max_batch_delay": request.max_batch_delay or None,
            # A proto3 bool cannot be absent: false is the gRPC API's default.
            "synchronous": request.synchronous,
        }
        return await self._run(context, lambda: management.register(self.client, params))

    async def ScaleWorker(self, request: Any, context: Context) -> Any:
        params = {
            "min_worker": request.min_worker,
            "max_worker": request.max_worker or request.min_worker,
            "synchronous": request.synchronous,
        }
        version = request.model_version or None
        return await self._run(
            context, lambda: management.scale(self.client, request.model_name, version, params)
        )

    async def SetDefault(self, request: Any, context: Context) -> Any:
        return await self._run(
            context,
            lambda: management.set_default(self.client, request.model_name, request.model_version),
        )

    async def UnregisterModel(self, request: Any, context: Context) -> Any:
        version = request.model_version or None
        return await self._run(
            context, lambda: management.unregister(self.client, request.model_name, version)
        )

    async def _run(self, context: Context, action: Callable[[], management.Answer]) -> Any:
        """Run an operation on a thread (it may wait for a load); its JSON in ``msg``."""
        try:
            _status, value = await self.threads.call(action)
        except Exception as ex:
            await _abort(context, ex)
        return torchserve_management_pb2.ManagementResponse(msg=pretty(value).decode().rstrip("\n"))


def add_to_server(server: GrpcServer, client: ModelClient, threads: Threads) -> None:
    """Register TorchServe's inference and management services."""
    torchserve_inference_pb2_grpc.add_InferenceAPIsServiceServicer_to_server(
        InferenceServicer(client), server
    )
    torchserve_management_pb2_grpc.add_ManagementAPIsServiceServicer_to_server(
        ManagementServicer(client, threads), server
    )
