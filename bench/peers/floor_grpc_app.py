"""The floor of a Python gRPC frontend: grpcio answering KServe's ModelInfer in place.

The gRPC twin of floor_asgi_app.py. It runs in the appliance's own
environment (the same grpcio and protobuf, and the appliance's generated
KServe stubs, its methods served through the appliance's gRPC registry with no
layers): each input comes back as an output, named as the request
asks, raw contents as sent. No model, no process hop: what is left is what
any grpcio frontend pays per call. ``aio`` is the appliance's stack
(grpc.aio, calls wait in an event loop); ``sync`` is grpcio's thread pool.
Several workers share the port with SO_REUSEPORT (the appliance's accept from
one socket that its master holds instead; only connecting differs, not a call)::

    python floor_grpc_app.py PORT aio|sync WORKERS THREADS
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from concurrent import futures
from typing import Any

import grpc

from appliance._generated import kserve_pb2 as pb
from appliance._generated import kserve_pb2_grpc as pb_grpc
from appliance.config.settings import ServerConfig
from appliance.frontends.grpc_registry import Registry
from appliance.processes.helper_threads import started_batch

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


def serve_sync(address: str, threads: int) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(threads), options=OPTIONS)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(SyncFloor(), server)
    server.add_insecure_port(address)
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
    server.wait_for_termination()


def _as_is(handler: Any, method: str) -> Any:
    return handler


async def serve_aio(address: str) -> None:
    # grpcio's threads under the policy the appliance's gRPC frontend starts them with.
    with started_batch(ServerConfig().helper_threads_batch):
        server = grpc.aio.server(options=OPTIONS)
    # The appliance's registry with no layers: every method served through one
    # generic handler, as its gRPC frontend serves them (grpc.aio's loop waits on a
    # pending call per *registered* method, walking them all for each call).
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(AioFloor(), Registry(server, _as_is))
    server.add_insecure_port(address)
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


def main(argv: list[str]) -> None:
    port, kind, workers, threads = argv[0], argv[1], int(argv[2]), int(argv[3])
    # gRPC does not survive fork: each further worker is a fresh interpreter,
    # stopped with this one (same session, so SIGTERM reaches the group's leader first).
    helpers = [
        subprocess.Popen([sys.executable, __file__, port, kind, "1", str(threads)])
        for _ in range(workers - 1)
    ]
    address = f"127.0.0.1:{port}"
    try:
        if kind == "aio":
            asyncio.run(serve_aio(address))
        else:
            serve_sync(address, threads)
    finally:
        for helper in helpers:
            helper.terminate()
            helper.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
