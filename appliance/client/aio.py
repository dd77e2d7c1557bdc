"""The event loop's sockets to the model workers, for asyncio frontends.

The asyncio twin of :class:`~appliance.client.channel.Channel`, with the
same sockets (a PUSH per instance, one bound PULL for replies). The loop
watches the PULL socket's file descriptor with ``add_reader``; its callback
puts each reply in the box of the request it answers and wakes the
coroutine waiting on that box. So an asyncio frontend calls models without
a thread hop, with one loop callback per burst of replies. A box holds the
messages its waiter has not taken yet: one reply for a unary call, parts
for a stream.

ZeroMQ's descriptor is edge-triggered: it signals that the socket's state
may have changed, not that a message is there. So the callback drains until
``EVENTS`` shows no message, and every send looks once more, since any
operation on a socket can consume the edge of a reply that arrived meanwhile.

One watchdog task per loop looks at every waiting request each slice and
fails it with WorkerLost when its instance died, or with DeadlineExceeded
when its deadline passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import zmq

from appliance.client.channel import PushSockets, worker_lost
from appliance.client.routing import Router, Target
from appliance.core.descriptor import DescriptorError, Message, from_frame, to_frame
from appliance.errors import ApplianceError, DeadlineExceeded

SLICE_S = 0.05
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_FD = int(zmq.FD)

Item = Message | ApplianceError


class _Box:
    """The messages of one request not yet taken, and the future its waiter awaits."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: deque[Item] = deque()
        self.waiter: asyncio.Future[Item] | None = None

    def put(self, item: Item) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            self.waiter = None
            waiter.set_result(item)
        else:
            self.items.append(item)


class AsyncChannel:
    """The sockets of one event loop.

    Args:
        context: the process's ZeroMQ context.
        number: this channel's number in its process (sent with requests).
        reply_endpoint: where this channel receives replies.
        endpoint: maps (slot, generation) to a worker's endpoint.
        router: for instance liveness checks.
        on_stray: called with a message no waiter expects (a late reply);
            it must give back the message's ring blocks.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        number: int,
        reply_endpoint: str,
        endpoint: Callable[[int, int], str],
        router: Router,
        on_stray: Callable[[Message], None],
    ) -> None:
        self.number = number
        self._router = router
        self._on_stray = on_stray
        self._loop = asyncio.get_running_loop()
        self._pushes = PushSockets(context, endpoint)
        self._inbox: dict[int, _Box] = {}
        self._waiting: dict[int, tuple[Target, float]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._replies: zmq.Socket[bytes] = context.socket(zmq.PULL)
        self._replies.setsockopt(zmq.LINGER, 0)
        self._replies.bind(reply_endpoint)
        self._fd = cast(int, self._replies.getsockopt(_FD))
        self._loop.add_reader(self._fd, self._drain)

    def _drain(self) -> None:
        replies = self._replies
        while cast(int, replies.getsockopt(_EVENTS)) & _POLLIN:
            frame = replies.recv(zmq.NOBLOCK)
            try:
                message = from_frame(frame)
            except DescriptorError:
                continue
            box = self._inbox.get(message.request_id)
            if box is not None:
                box.put(message)
            else:
                self._on_stray(message)

    def send(self, target: Target, message: Message, flags: int = 0) -> None:
        message.channel = self.number
        self._pushes.get(target).send(to_frame(message), flags, copy=True)
        # Look once more: the descriptor's edge may have been spent meanwhile.
        if cast(int, self._replies.getsockopt(_EVENTS)) & _POLLIN:
            self._loop.call_soon(self._drain)

    def expect(self, request_id: int) -> None:
        self._inbox[request_id] = _Box()

    def forget(self, request_id: int) -> None:
        box = self._inbox.pop(request_id, None)
        self._waiting.pop(request_id, None)
        if box is not None:
            # Parts a stream's consumer left untaken still hold ring space.
            for item in box.items:
                if isinstance(item, Message):
                    self._on_stray(item)

    async def wait(self, target: Target, request_id: int, deadline: float) -> Message:
        """Await the next message for ``request_id`` from ``target``.

        Raises:
            DeadlineExceeded: ``deadline`` (monotonic seconds, 0 = none) passed.
            WorkerLost: the instance died or was replaced meanwhile.
        """
        box = self._inbox[request_id]
        if box.items:
            item = box.items.popleft()
        else:
            if self._watchdog is None:
                self._watchdog = self._loop.create_task(self._watch())
            self._waiting[request_id] = (target, deadline)
            box.waiter = self._loop.create_future()
            try:
                item = await box.waiter
            finally:
                box.waiter = None
                self._waiting.pop(request_id, None)
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
                    box.put(DeadlineExceeded("the request's deadline passed before a reply came"))
                elif not self._router.is_current(target):
                    box.put(worker_lost(target))
                else:
                    continue
                del self._waiting[request_id]

    def close(self) -> None:
        """Tell every worker this channel used to forget it, then close."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        with contextlib.suppress(ValueError, RuntimeError):
            self._loop.remove_reader(self._fd)
        self._pushes.close(self.number)
        self._replies.close(0)
