"""A stand-in model worker for floor_grpc_app.py's ``aio-hop`` kind: every message on a
ZeroMQ ROUTER socket goes back to its sender as it came, in one blocking loop.

It does the least a model worker can: what is left of a call's cost in the
frontend that forwards to it is grpc.aio's and the ZeroMQ hop's. SIGTERM
ends it where it stands (its default action: a blocking receive does not
return for a Python handler); the frontend that started it removes the
socket's file::

    python hop_echo.py ipc:///PATH
"""

from __future__ import annotations

import sys

import zmq


def main(address: str) -> None:
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(address)
    while True:
        socket.send_multipart(socket.recv_multipart(copy=False), copy=False)


if __name__ == "__main__":
    main(sys.argv[1])
