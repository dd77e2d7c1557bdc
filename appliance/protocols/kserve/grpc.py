"""KServe v2 ``inference.GRPCInferenceService`` on the gRPC frontend.

SPEC: shared/specs/open-inference-grpc.md and PROTOCOL-FACTS §2.2, §2.4,
§2.5. Errors are the call's status (``errors.grpc_status``); within
ModelStreamInfer they travel as ``error_message`` and the stream goes on.
A request's time limit is the smaller of the client's gRPC deadline and the
KServe ``timeout`` parameter.

The server is grpc.aio's. Inference, streamed or not, waits in the event
loop; the other RPCs, which may block (a model load waits for its worker),
run on the frontend's threads.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from typing import Any

import grpc
from google.protobuf import json_format

from appliance._generated import triton_model_config_pb2
from appliance.client.api import ModelClient
from appliance.core.sequences import sequence_of
from appliance.errors import ApplianceError, DeadlineExceeded
from appliance.protocols.grpc_server import GrpcServer
from appliance.protocols.kserve import (
    infer,
    infer_stream,
    model_configuration,
    pbcodec,
    repository,
    service,
    statistics,
)
from appliance.protocols.kserve.errors import grpc_status
from appliance.protocols.kserve.inference import InferRequest, OutputData
from appliance.protocols.kserve.pbcodec import pb
from appliance.protocols.kserve.shm import RegionTable
from appliance.protocols.stream_answers import answer_side_by_side
from appliance.protocols.threads import Threads

log = logging.getLogger("appliance.kserve")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext[Any, Any]], Any]
Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = "GRPCInferenceService"
PRESERIALIZED = frozenset({"ModelInfer", "ModelStreamInfer"})
# SPEC: Triton's decoupled-stream parameters.
FINAL_FLAG = "triton_final_response"
WANTS_FINAL = "triton_enable_empty_final_response"


def rpc(method: Handler) -> Handler:
    """Make a unary call of ``method``; every failure becomes a gRPC status.

    A coroutine runs in the event loop; a plain method, which may block,
    on the servicer's threads.
    """
    in_loop = inspect.iscoroutinefunction(method)

    @functools.wraps(method)
    async def wrapper(self: InferenceServicer, request: Any, context: Context) -> Any:
        try:
            if in_loop:
                return await method(self, request, context)
            return await self.threads.call(method, self, request, context)
        except ApplianceError as ex:
            await context.abort(grpc.StatusCode[grpc_status(ex)], ex.message)
        except Exception:
            log.exception("KServe gRPC %s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method.__name__}")

    return wrapper


def _sequence_of(request: Any) -> Hashable | None:
    """The sequence a stream request is a step of (its model and sequence id), if any."""
    sequence = sequence_of(pbcodec.decode_parameters(request.parameters))
    return None if sequence is None else (request.model_name, sequence)


def timeout_s(context: Context, request: InferRequest) -> float | None:
    """Return the time the request may take: deadline or timeout parameter.

    Raises:
        DeadlineExceeded: the client's deadline has already passed.
    """
    limits = [t for t in (context.time_remaining(), request.timeout_s()) if t is not None]
    if not limits:
        return None
    limit = float(min(limits))
    if limit <= 0:
        raise DeadlineExceeded(f"the deadline of the request to {request.model} passed")
    return limit


class InferenceServicer:
    """The RPCs of inference.GRPCInferenceService, named as the proto names them."""

    def __init__(self, client: ModelClient, regions: RegionTable, threads: Threads) -> None:
        self.client = client
        self.regions = regions
        self.threads = threads

    # -- health and metadata ---------------------------------------------------

    @rpc
    def ServerLive(self, request: Any, context: Context) -> Any:
        return pb.ServerLiveResponse(live=self.client.server_live())

    @rpc
    def ServerReady(self, request: Any, context: Context) -> Any:
        return pb.ServerReadyResponse(ready=self.client.server_ready())

    @rpc
    def ModelReady(self, request: Any, context: Context) -> Any:
        ready = service.model_ready(self.client, request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    @rpc
    def ServerMetadata(self, request: Any, context: Context) -> Any:
        return pb.ServerMetadataResponse(**service.server_metadata())

    @rpc
    def ModelMetadata(self, request: Any, context: Context) -> Any:
        metadata = service.model_metadata(self.client, request.name, request.version)
        return pbcodec.encode_model_metadata(metadata)

    @rpc
    def ModelConfig(self, request: Any, context: Context) -> Any:
        config = model_configuration.model_config(self.client, request.name, request.version)
        return pb.ModelConfigResponse(
            config=json_format.ParseDict(config, triton_model_config_pb2.ModelConfig())
        )

    @rpc
    def ModelStatistics(self, request: Any, context: Context) -> Any:
        stats = statistics.model_statistics(self.client, request.name, request.version)
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    # -- inference -------------------------------------------------------------

    @rpc
    async def ModelInfer(self, request: Any, context: Context) -> bytes:
        decoded = pbcodec.decode_infer_request(request)
        limit = timeout_s(context, decoded)
        with await infer.infer_async(self.client, self.regions, decoded, limit) as outputs:
            return self._response(decoded, outputs)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], context: Context
    ) -> AsyncIterator[bytes]:
        """Each request of the stream answered as it comes, side by side with the others
        (a sequence's steps in order): stream_answers.py."""

        def answer(request: Any) -> AsyncIterator[bytes]:
            return self._answer_one(request, context)

        async for response in answer_side_by_side(requests, answer, _sequence_of):
            yield response

    async def _answer_one(self, request: Any, context: Context) -> AsyncIterator[bytes]:
        """One request's responses, or its error as a stream response."""
        try:
            async for response in self._stream_one(request, context):
                yield response
        except ApplianceError as ex:
            yield pbcodec.encode_stream_error(request.model_name, request.id, ex.message)
        except Exception:
            log.exception("KServe gRPC ModelStreamInfer failed")
            message = "internal error in the stream"
            yield pbcodec.encode_stream_error(request.model_name, request.id, message)

    async def _stream_one(self, request: Any, context: Context) -> AsyncIterator[bytes]:
        """Answer one request of a stream: one response, or one per part."""
        decoded = pbcodec.decode_infer_request(request)
        limit = timeout_s(context, decoded)
        wants_final = decoded.parameters.get(WANTS_FINAL) is True
        if not infer_stream.decoupled(self.client, decoded.model):
            flag = {FINAL_FLAG: True} if wants_final else None
            with await infer.infer_async(self.client, self.regions, decoded, limit) as outputs:
                response = self._response(decoded, outputs, flag)
            yield pbcodec.encode_stream_response(response)
            return
        # Closing the parts when this call ends early cancels the model's stream.
        async with contextlib.aclosing(self._parts(decoded, limit, wants_final)) as parts:
            async for response in parts:
                yield response

    async def _parts(
        self, decoded: InferRequest, limit: float | None, wants_final: bool
    ) -> AsyncGenerator[bytes, None]:
        """A decoupled model's responses.

        SPEC: Triton flags each response of a decoupled model with
        triton_final_response (false until the empty final one, which comes
        when the client asked for it, after the model's error response too),
        whether or not it asked.
        """
        flag = {FINAL_FLAG: False}
        stream = infer_stream.stream_async(self.client, self.regions, decoded, limit)
        try:
            async with contextlib.aclosing(stream) as parts:
                async for outputs in parts:
                    yield pbcodec.encode_stream_response(self._response(decoded, outputs, flag))
        except ApplianceError as ex:
            # The model's own error response: Triton sends it, then (when
            # asked) the empty final response that says the request is done.
            if not (wants_final and ex.ends_stream):
                raise
            yield pbcodec.encode_stream_error(decoded.model, decoded.id, ex.message)
        if wants_final:
            final = pbcodec.encode_infer_response(
                decoded.model, "", decoded.id, [], {FINAL_FLAG: True}
            )
            yield pbcodec.encode_stream_response(final)

    def _response(
        self,
        request: InferRequest,
        outputs: list[OutputData],
        parameters: dict[str, Any] | None = None,
    ) -> bytes:
        version = request.version or service.version_of(self.client, request.model)
        return pbcodec.encode_infer_response(
            request.model, version, request.id, outputs, parameters
        )

    # -- model repository --------------------------------------------------------

    @rpc
    def TraceSetting(self, request: Any, context: Context) -> Any:
        # An empty value list clears a model's own setting (tritonclient's None).
        changes = {name: list(value.value) or None for name, value in request.settings.items()}
        settings = self.client.trace_settings(request.model_name, changes or None)
        response = pb.TraceSettingResponse()
        for name, value in settings.items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response

    @rpc
    def RepositoryIndex(self, request: Any, context: Context) -> Any:
        index = repository.index(self.client, request.ready)
        return json_format.ParseDict({"models": index}, pb.RepositoryIndexResponse())

    @rpc
    def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        parameters = pbcodec.decode_parameters(request.parameters)
        repository.load(self.client, request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    @rpc
    def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        repository.unload(self.client, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ---------------------------------------------------------------

    @rpc
    def SystemSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.regions.status(request.name or None):
            response.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region.status())
            )
        return response

    @rpc
    def SystemSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        self.regions.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        self.regions.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc
    def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self.regions.cuda_status(request.name or None):
            response.regions[region.name].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**region.status())
            )
        return response

    @rpc
    def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        self.regions.register_cuda(
            request.name, request.raw_handle, request.device_id, request.byte_size
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @rpc
    def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        # SPEC: PROTOCOL-FACTS §2.7 — succeeds with none registered (a CPU-only server).
        self.regions.unregister(request.name or None, "cuda")
        return pb.CudaSharedMemoryUnregisterResponse()


def method_handlers(servicer: InferenceServicer) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Return a handler per RPC of the service, built from the proto's descriptor.

    PERF: ModelInfer and ModelStreamInfer return messages pbcodec already
    serialized (outputs copied once), so their serializer passes bytes on.
    """
    handlers = {}
    for method in pb.DESCRIPTOR.services_by_name[SERVICE_NAME].methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        serialize = _as_is if method.name in PRESERIALIZED else response.SerializeToString
        behaviour = getattr(servicer, method.name)
        if method.client_streaming:
            handler = grpc.stream_stream_rpc_method_handler(
                behaviour, request.FromString, serialize
            )
        else:
            handler = grpc.unary_unary_rpc_method_handler(behaviour, request.FromString, serialize)
        handlers[method.name] = handler
    return handlers


def _as_is(message: bytes) -> bytes:
    return message


def add_to_server(server: GrpcServer, client: ModelClient, threads: Threads) -> None:
    """Register the KServe service."""
    servicer = InferenceServicer(
        client,
        RegionTable(client.tree.dir, client.config.shm.cuda_copies, client.open_region),
        threads,
    )
    server.add_registered_method_handlers(f"inference.{SERVICE_NAME}", method_handlers(servicer))
