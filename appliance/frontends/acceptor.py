"""Accept from a listening socket that sibling processes share, one connection a turn.

asyncio's own server takes every connection waiting (up to its backlog)
each time its socket turns readable. On a socket that several processes
share (the master's, see ``appliance/config/listeners.py``), the first process to
wake would then take the whole run of connections that arrived together,
and its siblings none: clients that connect at once and keep their
connections would all load one process. Taking one connection per turn of
the event loop makes every process that a connection wakes compete for the
next one, and a busy process, late to its turn, leaves new connections to
idle ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from appliance.frontends.descriptors import Descriptors

log = logging.getLogger("appliance.frontends")

# After an accept that failed for want of memory: the socket stays readable,
# so it is left unwatched this long instead of spinning.
RETRY_S = 1.0
# accept's answers when the process (or the system) has no descriptor left.
_NO_DESCRIPTOR = (errno.EMFILE, errno.ENFILE)


class Acceptor:
    """Serve connections from ``sock`` with protocols made by ``factory``, in this loop."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.BaseProtocol],
        descriptors: Descriptors | None = None,
    ) -> None:
        self._sock = sock
        self._factory = factory
        self._descriptors = descriptors
        # Closed to accept (and close at once) a connection when no descriptor
        # is left, so a client is refused instead of waiting in the queue.
        self._spare: int | None = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        self._loop = asyncio.get_running_loop()
        self._starting: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        try:
            conn, _peer = self._sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # a sibling took it, or its client gave up
        except OSError as ex:
            if ex.errno in _NO_DESCRIPTOR and self._refuse_one():
                return
            log.warning("cannot accept a connection (%s); retrying in %.0f s", ex, RETRY_S)
            self._loop.remove_reader(self._sock.fileno())
            self._loop.call_later(RETRY_S, self._resume)
            return
        conn.setblocking(False)
        task = self._loop.create_task(self._loop.connect_accepted_socket(self._factory, conn))
        self._starting.add(task)
        task.add_done_callback(lambda done: self._started(done, conn))

    def _refuse_one(self) -> bool:
        """Accept the waiting connection on the spare descriptor and close it."""
        if self._spare is None:
            return False
        os.close(self._spare)
        self._spare = None
        try:
            conn, _peer = self._sock.accept()
        except OSError:
            pass
        else:
            conn.close()
            if self._descriptors is not None:
                self._descriptors.refuse("no descriptor left to accept a connection")
        with contextlib.suppress(OSError):
            self._spare = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        return True

    def _started(self, task: asyncio.Task[Any], conn: socket.socket) -> None:
        self._starting.discard(task)
        if task.cancelled() or task.exception() is not None:
            conn.close()

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        """Accept no more; this process's copy of the socket is closed, never shut down."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
