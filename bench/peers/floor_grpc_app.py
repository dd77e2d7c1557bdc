"""The floor of a Python gRPC frontend: grpcio answering KServe's ModelInfer in place.

The gRPC twin of floor_asgi_app.py. It runs in the appliance's own
environment (the same grpcio and protobuf, and the appliance's generated
KServe stubs, its methods served through the appliance's gRPC registry with no
layers): each input comes back as an output, named as the request
asks, raw contents as sent. No model, no process hop: what is left is what
any grpcio frontend pays per call. ``aio`` is the appliance's stack
(grpc.aio, calls wait in an event loop, of the kind the appliance's
``server.event_loop`` names); ``sync`` is grpcio's thread pool.
``aio-hop`` is ``aio`` with the hop to a model worker: each call's input goes
to another process (hop_echo.py, which sends it straight back) over ZeroMQ,
and the call is answered when it returns, so what the appliance's gRPC
frontend spends above it is its own path (decoding, the ring, the
descriptor, encoding), not grpc.aio's nor the hop's. ``aio-codec`` is
``aio`` answering with the appliance's own protobuf codec (pbcodec: the
request decoded, each input handed back as an output, the response encoded
and passed on already serialized, as its gRPC frontend does): the codec's
rung, as ladder_app.py's ``codec`` is for HTTP. Several workers share
the port with SO_REUSEPORT (the appliance's accept from one socket that its
master holds instead; only connecting differs, not a call)::

    python floor_grpc_app.py PORT aio|aio-hop|aio-codec|sync WORKERS THREADS [ECHO_ADDRESS]
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from concurrent import futures
from typing import Any

import grpc
import hop_echo

from appliance._generated import kserve_pb2 as pb
from appliance._generated import kserve_pb2_grpc as pb_grpc
from appliance.config.settings import ServerConfig
from appliance.frontends import loops
from appliance.frontends.grpc_registry import Registry
from appliance.processes.helper_threads import started_batch
from appliance.protocols.kserve import pbcodec
from appliance.protocols.kserve.inference import OutputData

OPTIONS = [
    ("grpc.so_reuseport", 1),
    ("grpc.max_receive_message_length", 1 << 30),
    ("grpc.max_send_message_length", 1 << 30),
]


def answer(request: Any) -> Any:
    """The reply to ModelInfer: every input back as an output."""
    wanted = [output.name for output in request.outputs]
    reply = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    for index, tensor in enumerate(request.inputs):
        output = reply.outputs.add()
        output.name = wanted[index] if index < len(wanted) else f"OUTPUT{index}"
        output.datatype = tensor.datatype
        output.shape.extend(tensor.shape)
        if tensor.HasField("contents"):
            output.contents.CopyFrom(tensor.contents)
    reply.raw_output_contents.extend(request.raw_input_contents)
    return reply


class SyncFloor(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    def ModelInfer(self, request: Any, context: Any) -> Any:
        return answer(request)


class AioFloor(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return answer(request)


class AioHopFloor(AioFloor):
    """Each call's raw input to hop_echo.py and back before the answer."""

    def __init__(self, address: str) -> None:
        self.hop = hop_echo.Hop(address)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        await self.hop.round_trip(b"".join(request.raw_input_contents))
        return answer(request)


class AioCodecFloor(AioFloor):
    """ModelInfer through the appliance's codec, its response serialized by it."""

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        decoded = pbcodec.decode_infer_request(request)
        wanted = [output.name for output in decoded.outputs or ()]
        outputs = [
            OutputData(wanted[i] if i < len(wanted) else f"OUTPUT{i}", tensor.data, False, None)
            for i, tensor in enumerate(decoded.inputs)
            if tensor.data is not None
        ]
        return pbcodec.encode_infer_response(decoded.model, "1", decoded.id, outputs, None)


def codec_handlers(servicer: AioCodecFloor) -> dict[str, Any]:
    """ServerReady as generated; ModelInfer's response passed on as pbcodec serialized it."""
    return {
        "ServerReady": grpc.unary_unary_rpc_method_handler(
            servicer.ServerReady,
            pb.ServerReadyRequest.FromString,
            pb.ServerReadyResponse.SerializeToString,
        ),
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            servicer.ModelInfer, pb.ModelInferRequest.FromString, _serialized
        ),
    }


def serve_sync(address: str, threads: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(threads), options=OPTIONS)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(SyncFloor(), server)
    server.add_insecure_port(address)
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


def _as_is(handler: Any, method: str) -> Any:
    return handler


def _serialized(message: bytes) -> bytes:
    return message


async def serve_aio(address: str, kind: str, echo: str | None) -> None:
    # grpcio's threads under the policy the appliance's gRPC frontend starts them with.
    with started_batch(ServerConfig().helper_threads_batch):
        server = grpc.aio.server(options=OPTIONS)
    # The appliance's registry with no layers: every method served through one
    # generic handler, as its gRPC frontend serves them (grpc.aio's loop waits on a
    # pending call per *registered* method, walking them all for each call).
    registry = Registry(server, _as_is)
    if kind == "aio-codec":
        handlers = codec_handlers(AioCodecFloor())
        registry.add_registered_method_handlers("inference.GRPCInferenceService", handlers)
    else:
        servicer = AioFloor() if echo is None else AioHopFloor(echo)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, registry)
    server.add_insecure_port(address)
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


def main(argv: list[str]) -> None:
    port, kind, workers, threads = argv[0], argv[1], int(argv[2]), int(argv[3])
    if kind == "aio-hop" and len(argv) == 4:
        # The first worker starts the echo and hands the others its address.
        with hop_echo.started() as echo:
            serve(port, kind, workers, threads, echo)
    else:
        serve(port, kind, workers, threads, argv[4] if len(argv) > 4 else None)


def serve(port: str, kind: str, workers: int, threads: int, echo: str | None) -> None:
    """Serve ``kind`` from this process and ``workers - 1`` more until SIGTERM."""
    # gRPC does not survive fork: each further worker is a fresh interpreter,
    # stopped with this one (same session, so SIGTERM reaches the group's leader first).
    more = [] if echo is None else [echo]
    helpers = [
        subprocess.Popen([sys.executable, __file__, port, kind, "1", str(threads), *more])
        for _ in range(workers - 1)
    ]
    address = f"127.0.0.1:{port}"
    try:
        if kind == "sync":
            serve_sync(address, threads)
        else:
            # On the event loop the appliance's frontends run on (uvloop by default).
            loops.run(serve_aio(address, kind, echo), ServerConfig().event_loop)
    finally:
        for helper in helpers:
            helper.terminate()
            helper.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
