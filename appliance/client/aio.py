"""The event loop's sockets to the model workers, for asyncio frontends.

The asyncio twin of :class:`~appliance.client.channel.Channel`: the loop owns
one DEALER socket per instance, watches each socket's file descriptor with
``add_reader``, and hands every reply straight to the future or queue of the
request waiting for it, so an asyncio frontend (MIP) calls models without a
thread hop and with one loop callback per burst of replies.

ZeroMQ's descriptor is edge-triggered: it signals that the socket's state
may have changed, not that a message is there. So the callback drains until
``EVENTS`` shows no message, and every send looks once more, since a send
can consume the edge of a reply that arrived meanwhile.

One watchdog task per loop looks at every waiting request each slice and
fails it with WorkerLost when its instance died, or with DeadlineExceeded
when its deadline passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, cast

import zmq

from appliance.client.routing import Router, Target
from appliance.core.descriptor import DescriptorError, Message, from_frame, to_frame
from appliance.errors import ApplianceError, DeadlineExceeded, WorkerLost

SLICE_S = 0.05
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_FD = int(zmq.FD)

Item = Message | ApplianceError


class AsyncChannel:
    """The sockets of one event loop.

    Args:
        context: the process's ZeroMQ context.
        endpoint: maps (slot, generation) to the worker's endpoint.
        router: for instance liveness checks.
        on_stray: called with a message no waiter expects (a late reply);
            it must give back the message's ring blocks.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: Callable[[int, int], str],
        router: Router,
        on_stray: Callable[[Target, Message], None],
    ) -> None:
        self._context = context
        self._endpoint = endpoint
        self._router = router
        self._on_stray = on_stray
        self._loop = asyncio.get_running_loop()
        self._sockets: dict[int, tuple[int, zmq.Socket[bytes], int]] = {}
        self._inbox: dict[int, asyncio.Queue[Item]] = {}
        self._waiting: dict[int, tuple[Target, float]] = {}
        self._watchdog: asyncio.Task[None] | None = None

    def socket(self, target: Target) -> zmq.Socket[bytes]:
        """Return the loop's socket to ``target``, connecting if needed."""
        known = self._sockets.get(target.slot)
        if known is not None:
            generation, old, fd = known
            if generation == target.generation:
                return old
            # A replaced worker: drop whatever was queued for the old one.
            self._loop.remove_reader(fd)
            old.close(0)
        socket: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self._endpoint(target.slot, target.generation))
        fd = cast(int, socket.getsockopt(_FD))
        self._loop.add_reader(fd, self._drain, target, socket)
        self._sockets[target.slot] = (target.generation, socket, fd)
        return socket

    def _drain(self, target: Target, socket: zmq.Socket[bytes]) -> None:
        while cast(int, socket.getsockopt(_EVENTS)) & _POLLIN:
            frame = socket.recv(zmq.NOBLOCK)
            try:
                message = from_frame(frame)
            except DescriptorError:
                continue
            box = self._inbox.get(message.request_id)
            if box is not None:
                box.put_nowait(message)
            else:
                self._on_stray(target, message)

    def send(self, target: Target, message: Message) -> None:
        socket = self.socket(target)
        socket.send(to_frame(message), copy=True)
        # The send may have consumed the edge of a reply that is waiting.
        if cast(int, socket.getsockopt(_EVENTS)) & _POLLIN:
            self._loop.call_soon(self._drain, target, socket)

    def expect(self, request_id: int) -> None:
        self._inbox[request_id] = asyncio.Queue()

    def forget(self, request_id: int) -> None:
        self._inbox.pop(request_id, None)

    async def wait(self, target: Target, request_id: int, deadline: float) -> Message:
        """Await a message for ``request_id`` from ``target``.

        Raises:
            DeadlineExceeded: ``deadline`` (monotonic seconds, 0 = none) passed.
            WorkerLost: the instance died or was replaced meanwhile.
        """
        box = self._inbox[request_id]
        if box.empty():
            if self._watchdog is None:
                self._watchdog = self._loop.create_task(self._watch())
            self._waiting[request_id] = (target, deadline)
            try:
                item = await box.get()
            finally:
                self._waiting.pop(request_id, None)
        else:
            item = box.get_nowait()
        if isinstance(item, ApplianceError):
            raise item
        return item

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(SLICE_S)
            now = time.monotonic()
            for request_id, (target, deadline) in list(self._waiting.items()):
                box = self._inbox.get(request_id)
                if box is None:
                    continue
                if deadline and now > deadline:
                    box.put_nowait(
                        DeadlineExceeded("the request's deadline passed before a reply came")
                    )
                elif not self._router.is_current(target):
                    box.put_nowait(
                        WorkerLost(
                            f"the model worker (pid {target.pid}) holding this request "
                            "exited; the request may be retried"
                        )
                    )
                else:
                    continue
                del self._waiting[request_id]

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        for _generation, socket, fd in self._sockets.values():
            with contextlib.suppress(ValueError, RuntimeError):
                self._loop.remove_reader(fd)
            with contextlib.suppress(zmq.ZMQError):
                socket.close(0)
        self._sockets.clear()
