"""The hop to a model worker that does nothing, for the floors that carry it
(floor_grpc_app.py's ``aio-hop``, ladder_app.py's ``hop`` rung).

Run as a script, it is that worker: every message on a ZeroMQ ROUTER socket
goes back to its sender as it came, in one blocking loop. SIGTERM ends it where
it stands (its default action: a blocking receive does not return for a Python
handler)::

    python hop_echo.py ipc:///PATH

:func:`started` runs it as a child of the calling process (so a floor's process
tree holds it) and :class:`Hop` is a frontend's side of it: what a floor spends
above its in-place twin is the hop's, with nothing of a model worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import zmq


def main(address: str) -> None:
    socket = zmq.Context().socket(zmq.ROUTER)
    socket.bind(address)
    while True:
        socket.send_multipart(socket.recv_multipart(copy=False), copy=False)


@contextlib.contextmanager
def started() -> Iterator[str]:
    """The echo as this process's child, for the time inside: yields its address, and
    afterwards stops it and removes its socket's file."""
    scratch = tempfile.mkdtemp(prefix="hop-echo-")
    address = f"ipc://{scratch}/echo"
    echo = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), address])
    try:
        yield address
    finally:
        echo.terminate()
        echo.wait()
        shutil.rmtree(scratch, ignore_errors=True)


class Hop:
    """A frontend's side of the echo: one DEALER socket per process, read by the event
    loop, as the appliance's asyncio channel does. Connected on the first round trip,
    in the loop that makes it (after a fork, where the server forks its workers)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.socket: zmq.Socket[bytes] | None = None
        self.waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self.keys = itertools.count()

    async def round_trip(self, body: bytes) -> bytes:
        """``body`` to the echo and back."""
        loop = asyncio.get_running_loop()
        key = next(self.keys).to_bytes(8, "little")
        waiter: asyncio.Future[bytes] = loop.create_future()
        self.waiting[key] = waiter
        self._connected().send_multipart([key, body])
        # A send can leave the descriptor's edge spent with a reply already queued.
        loop.call_soon(self._drain)
        return await waiter

    def _connected(self) -> zmq.Socket[bytes]:
        if self.socket is None:
            self.socket = zmq.Context().socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.connect(self.address)
            fd = int(self.socket.getsockopt(zmq.FD))
            asyncio.get_running_loop().add_reader(fd, self._drain)
        return self.socket

    def _drain(self) -> None:
        # ZeroMQ's descriptor is edge-triggered: read until nothing is left.
        socket = self._connected()
        while int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            key, body = socket.recv_multipart()
            waiter = self.waiting.pop(key, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(body)


if __name__ == "__main__":
    main(sys.argv[1])
