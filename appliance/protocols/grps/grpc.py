"""GRPS's gRPC service (grps.protos.v1.GrpsService) on the gRPC frontend.

SPEC: grps.md "RPC接口" and PROTOCOL-FACTS §3.1, §3.2. Every RPC ends with
gRPC status OK; success and failure live in ``GrpsMessage.status``, as in
GRPS's own servers. Online and Offline flip the host's one online flag, so
they change every protocol's readiness, not only this service's.

Request options for the model (echo's ``chunks``, ``chunk_delay_s``) come
from the call's metadata, e.g. ``metadata=[("chunks", "5")]``.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import grpc

from appliance._generated import grps_pb2_grpc
from appliance.client.api import ModelClient
from appliance.protocols.grps import service
from appliance.protocols.grps.errors import OK, bad_request
from appliance.protocols.grps.pbcodec import (
    GrpsMessage,
    decode_message,
    encode_error,
    encode_message,
    status,
)

# Metadata gRPC itself sends; the rest reaches the model as parameters.
_TRANSPORT_KEYS = ("user-agent", "content-type", "te", "accept-encoding", "authorization")


class GrpsServicer(grps_pb2_grpc.GrpsServiceServicer):  # type: ignore[misc]
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            payload = decode_message(request)
            parameters = _parameters(context.invocation_metadata())
            return service.predict(
                self.client, payload, parameters, encode_message, timeout_s=_deadline(context)
            )
        except Exception as ex:
            return encode_error(service.failure(ex))

    def PredictStreaming(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """Yield each part as the model streams it; stop when the client leaves.

        gRPC drops (and so closes) this generator when the call ends; the
        callback also stops it at the next part if the client cancelled.
        """
        gone = threading.Event()
        context.add_callback(gone.set)
        parts: Generator[Any, None, None] | None = None
        try:
            payload = decode_message(request)
            parameters = _parameters(context.invocation_metadata())
            parts = service.stream(
                self.client, payload, parameters, encode_message, timeout_s=_deadline(context)
            )
            for part in parts:
                if gone.is_set() or not context.is_active():
                    return
                yield part
        except Exception as ex:
            yield encode_error(service.failure(ex))
        finally:
            if parts is not None:
                parts.close()

    def Online(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _run(lambda: service.set_online(self.client, True))

    def Offline(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _run(lambda: service.set_online(self.client, False))

    def CheckLiveness(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.client.server_live():
            return GrpsMessage(status=status())
        return GrpsMessage(status=status(503, service.UNAVAILABLE))

    def CheckReadiness(self, request: Any, context: grpc.ServicerContext) -> Any:
        # GRPS's Python server answers 403 here and its C++ server 503; 503
        # matches the REST route.
        if service.ready(self.client):
            return GrpsMessage(status=status())
        return GrpsMessage(status=status(503, service.UNAVAILABLE))

    def ServerMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        return _run(lambda: service.server_metadata(self.client))

    def ModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        def describe() -> str:
            if request.WhichOneof("data_oneof") != "str_data" or not request.str_data:
                raise bad_request("No model name: send the model's name in str_data")
            return service.model_metadata(self.client, request.str_data)

        return _run(describe)


def _run(action: Any) -> Any:
    """Return OK (with str_data if ``action`` returns text), or the failure."""
    try:
        text = action()
    except Exception as ex:
        return encode_error(service.failure(ex))
    reply = GrpsMessage(status=status(OK))
    if isinstance(text, str):
        reply.str_data = text
    return reply


def _deadline(context: grpc.ServicerContext) -> float | None:
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


def add_to_server(server: grpc.Server, client: ModelClient) -> None:
    """Register grps.protos.v1.GrpsService."""
    grps_pb2_grpc.add_GrpsServiceServicer_to_server(GrpsServicer(client), server)


__all__ = ["GrpsServicer", "add_to_server"]
