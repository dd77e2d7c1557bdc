"""The event loop's sockets to the model workers, for asyncio frontends.

The asyncio kind of :class:`~appliance.client.channel.Channel`, with the
same sockets (:class:`~appliance.client.channel.ReplySockets`). The loop
watches the PULL socket's file descriptor with ``add_reader``; its callback
puts each reply in the box of the request it answers and wakes the
coroutine waiting on that box. So an asyncio frontend calls models without
a thread hop, with one loop callback per burst of replies. A box holds the
messages its waiter has not taken yet: one reply for a unary call, parts
for a stream.

ZeroMQ's descriptor is edge-triggered: it signals that the socket's state
may have changed, not that a message is there. So the callback drains until
a zero-timeout poll (which reads ``EVENTS``) shows no message. Only
operations on the PULL socket itself (the drain's) can spend its edge: sends
go out on the PUSH sockets, which have mailboxes of their own, so a send need
not look again.

One watchdog task per loop looks at every waiting request each slice and
fails it with WorkerLost when its instance died, or with DeadlineExceeded
when its deadline passed.

PERF: sends wait for the end of the loop turn. Under concurrency an HTTP
or gRPC frontend's loop starts several requests in one turn (3.6 a turn at
16 KServe REST clients); their messages to one instance go as one frame
(descriptor.join_frames), so the turn costs one send, one wake-up of this
process's ZeroMQ I/O thread and one of the worker's, where each request
cost one of each. A request sent while none of the loop's others awaits a
reply goes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import cast

import zmq

from appliance.client.channel import ReplySockets, Wiring, worker_lost
from appliance.client.reply_box import ReplyBox
from appliance.client.routing import Target
from appliance.core.descriptor import Message, join_frames, to_frame
from appliance.core.zmq_send import NOBLOCK, poll, send_frame
from appliance.errors import ApplianceError, DeadlineExceeded, WorkerLost

SLICE_S = 0.05
_FD = int(zmq.FD)


class AsyncChannel(ReplySockets[ReplyBox]):
    """The sockets of one event loop (arguments: those of :class:`ReplySockets`)."""

    def __init__(self, wiring: Wiring, number: int) -> None:
        super().__init__(wiring, number)
        self._loop = asyncio.get_running_loop()
        self._waiting: dict[int, tuple[Target, float]] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._fd = cast(int, self._replies.getsockopt(_FD))
        self._polled = [(self._replies, int(zmq.POLLIN))]
        self._loop.add_reader(self._fd, self._drain)
        # Frames to send at the turn's end, by instance, with their request ids.
        self._outgoing: dict[tuple[int, int], tuple[Target, list[bytes], list[int]]] = {}

    def send(self, target: Target, message: Message, flags: int = 0) -> None:
        """Send ``message`` to ``target`` at the end of this loop turn, with the
        turn's others to it; at once when it is the loop's only request in
        flight, or ``flags`` (NOBLOCK: a release) is given."""
        if flags or not (self._waiting or self._outgoing):
            # A lone request goes at once: nothing would join it this turn.
            super().send(target, message, flags)
            return
        message.channel = self.number
        outgoing = self._outgoing
        if not outgoing:
            self._loop.call_soon(self._flush)
        key = (target.slot, target.generation)
        queued = outgoing.get(key)
        if queued is None:
            outgoing[key] = (target, [to_frame(message)], [message.request_id])
        else:
            queued[1].append(to_frame(message))
            queued[2].append(message.request_id)

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, {}
        for target, frames, request_ids in outgoing.values():
            try:
                send_frame(self._pushes.get(target), join_frames(frames), 0)
            except zmq.ZMQError as ex:
                # The callers have returned: their requests fail through their boxes.
                for request_id in request_ids:
                    box = self._inbox.get(request_id)
                    if box is not None:
                        box.append(
                            WorkerLost(f"the request could not be sent to its model worker: {ex}")
                        )

    def _drain(self) -> None:
        replies, polled = self._replies, self._polled
        # PERF: a zero-timeout poll answers what EVENTS does (and spends the
        # edge alike) for two thirds of pyzmq's getsockopt.
        while poll(polled, 0):
            self._route(replies.recv(NOBLOCK))

    def expect(self, request_id: int) -> None:
        self._inbox[request_id] = ReplyBox()

    def forget(self, request_id: int) -> None:
        self._waiting.pop(request_id, None)
        super().forget(request_id)

    async def wait(self, target: Target, request_id: int, deadline: float) -> Message:
        """Await the next message for ``request_id`` from ``target``.

        Raises:
            DeadlineExceeded: ``deadline`` (monotonic seconds, 0 = none) passed.
            WorkerLost: the instance died or was replaced meanwhile.
        """
        box = self._inbox[request_id]
        if box:
            item = box.popleft()
            self._taken(request_id, box)
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
                    box.append(
                        DeadlineExceeded("the request's deadline passed before a reply came")
                    )
                elif not self._router.is_current(target):
                    box.append(worker_lost(target))
                else:
                    continue
                del self._waiting[request_id]

    def close(self) -> None:
        """Send what this turn queued; tell every worker this channel used to
        forget it, then close."""
        if self._outgoing:
            self._flush()
        if self._watchdog is not None:
            self._watchdog.cancel()
        with contextlib.suppress(ValueError, RuntimeError):
            self._loop.remove_reader(self._fd)
        super().close()
