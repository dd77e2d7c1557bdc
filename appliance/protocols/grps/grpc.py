"""GRPS's gRPC service (grps.protos.v1.GrpsService) on the gRPC frontend.

SPEC: grps.md "RPC接口" and PROTOCOL-FACTS §3.1, §3.2. Every RPC ends with
gRPC status OK; success and failure live in ``GrpsMessage.status``, as in
GRPS's own servers. Online and Offline flip the host's one online flag, so
they change every protocol's readiness, not only this service's.

Request options for the model (echo's ``chunks``, ``chunk_delay_s``) come
from the call's metadata, e.g. ``metadata=[("chunks", "5")]``.

Predict and PredictStreaming wait in the gRPC frontend's event loop; the
calls that may block run on the frontend's threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc

from appliance._generated import grps_pb2_grpc
from appliance.client.api import ModelClient
from appliance.protocols.grpc_server import GrpcServer
from appliance.protocols.grps import service
from appliance.protocols.grps.errors import OK, bad_request
from appliance.protocols.grps.pbcodec import (
    GrpsMessage,
    decode_message,
    encode_error,
    encode_message,
    status,
)
from appliance.protocols.threads import Threads

# Metadata gRPC itself sends; the rest reaches the model as parameters.
_TRANSPORT_KEYS = ("user-agent", "content-type", "te", "accept-encoding", "authorization")


Context = grpc.aio.ServicerContext[Any, Any]


class GrpsServicer(grps_pb2_grpc.GrpsServiceServicer):  # type: ignore[misc]
    def __init__(self, client: ModelClient, threads: Threads) -> None:
        self.client = client
        self.threads = threads

    async def Predict(self, request: Any, context: Context) -> Any:
        try:
            payload = decode_message(request)
            parameters = _parameters(context.invocation_metadata())
            return await service.predict_async(
                self.client, payload, parameters, encode_message, timeout_s=_deadline(context)
            )
        except Exception as ex:
            return encode_error(service.failure(ex))

    async def PredictStreaming(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """Yield each part as the model streams it.

        When the client leaves, gRPC cancels this generator, and closing
        the parts cancels the model's stream in its worker.
        """
        try:
            payload = decode_message(request)
            parameters = _parameters(context.invocation_metadata())
            deadline = _deadline(context)
            stream = service.stream_async(
                self.client, payload, parameters, encode_message, timeout_s=deadline
            )
            async with contextlib.aclosing(stream) as parts:
                async for part in parts:
                    yield part
        except Exception as ex:
            yield encode_error(service.failure(ex))

    async def Online(self, request: Any, context: Context) -> Any:
        return await self._run(lambda: service.set_online(self.client, True))

    async def Offline(self, request: Any, context: Context) -> Any:
        return await self._run(lambda: service.set_online(self.client, False))

    async def CheckLiveness(self, request: Any, context: Context) -> Any:
        if self.client.server_live():
            return GrpsMessage(status=status())
        return GrpsMessage(status=status(503, service.UNAVAILABLE))

    async def CheckReadiness(self, request: Any, context: Context) -> Any:
        # GRPS's Python server answers 403 here and its C++ server 503; 503
        # matches the REST route.
        if service.ready(self.client):
            return GrpsMessage(status=status())
        return GrpsMessage(status=status(503, service.UNAVAILABLE))

    async def ServerMetadata(self, request: Any, context: Context) -> Any:
        return await self._run(lambda: service.server_metadata(self.client))

    async def ModelMetadata(self, request: Any, context: Context) -> Any:
        def describe() -> str:
            if request.WhichOneof("data_oneof") != "str_data" or not request.str_data:
                raise bad_request("No model name: send the model's name in str_data")
            return service.model_metadata(self.client, request.str_data)

        return await self._run(describe)

    async def _run(self, action: Callable[[], object]) -> Any:
        """Return OK (with str_data if ``action`` returns text), or the failure.

        ``action`` may block (it reaches the master or reads metadata), so
        it runs on a thread.
        """
        try:
            text = await self.threads.call(action)
        except Exception as ex:
            return encode_error(service.failure(ex))
        reply = GrpsMessage(status=status(OK))
        if isinstance(text, str):
            reply.str_data = text
        return reply


def _deadline(context: Context) -> float | None:
    """The call's deadline, so a model never works for a caller that gave up."""
    remaining = context.time_remaining()
    return None if remaining is None or remaining > 1e6 else max(remaining, 1e-3)


def _parameters(metadata: Iterable[Any] | None) -> dict[str, Any]:
    pairs = [
        (item.key, item.value)
        for item in metadata or ()
        if isinstance(item.value, str)
        and not item.key.startswith(("grpc-", ":"))
        and item.key not in _TRANSPORT_KEYS
    ]
    return service.parameters(pairs, ())


def add_to_server(server: GrpcServer, client: ModelClient, threads: Threads) -> None:
    """Register grps.protos.v1.GrpsService."""
    grps_pb2_grpc.add_GrpsServiceServicer_to_server(GrpsServicer(client, threads), server)


__all__ = ["GrpsServicer", "add_to_server"]
