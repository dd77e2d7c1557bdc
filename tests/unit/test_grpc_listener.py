"""A grpc.aio server serves a listening socket it was handed, and its stop leaves it listening.

The socket stands for the master's (appliance/master/ports.py): the test
keeps its own copy, as the master does, and hands the server another.
"""

from __future__ import annotations

import asyncio
import os
import socket

import grpc

from appliance.frontends.grpc_listener import registrations, serve_on

METHOD = "/test.Echo/Echo"


def echo_handler() -> grpc.GenericRpcHandler:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request + b" from " + str(os.getpid()).encode()

    handler = grpc.unary_unary_rpc_method_handler(echo)
    return grpc.method_handlers_generic_handler("test.Echo", {"Echo": handler})


async def call(port: int) -> bytes:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply: bytes = await channel.unary_unary(METHOD)(b"ping", timeout=10)
        return reply


async def serve_then_stop(master: socket.socket) -> tuple[bytes, int]:
    """Serve one call on a copy of ``master``; stop; return the reply and fds left on it."""
    port = master.getsockname()[1]
    handed = socket.socket(fileno=os.dup(master.fileno()))
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((echo_handler(),))
    listener = serve_on(handed, server.add_insecure_port)
    assert handed.fileno() == -1  # closed: its socket lives on under grpcio's number
    assert len(registrations(listener.fd)) == 1
    await server.start()
    try:
        reply = await call(port)
    finally:
        listener.release()
        await server.stop(None)
    return reply, len(registrations(listener.fd))


def test_the_server_answers_on_the_handed_socket_and_its_stop_leaves_it_listening() -> None:
    master = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        reply, watched = asyncio.run(serve_then_stop(master))
        assert reply == f"ping from {os.getpid()}".encode()
        assert watched == 0
        # Still listening: grpcio shut down the stand-in, not this socket.
        assert master.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        master.settimeout(5.0)
        with socket.create_connection(master.getsockname(), timeout=5):
            queued, _peer = master.accept()
            queued.close()
        # And a second server takes it over as the first did.
        reply, _watched = asyncio.run(serve_then_stop(master))
        assert reply.startswith(b"ping from ")
    finally:
        master.close()
