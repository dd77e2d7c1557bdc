"""One thread's sockets to the model workers, and waiting for replies on them.

ZeroMQ sockets are not thread-safe, and handing every request to a dispatch
thread would add two wake-ups (~50 us on this machine kind) to each round
trip. So each thread that calls the client owns one DEALER socket per
instance it talks to, sends on it, and blocks on it for the reply.

A thread waits in a blocking receive bounded by a short slice (RCVTIMEO);
between slices it checks the deadline and the instance's generation in the
status table, so a worker that dies fails its requests within one slice
instead of leaving them hanging.

PERF: on this machine kind an idle vCPU halts at once, and waking it costs
more than a small request's whole round trip (LIMITS.md: ~110 us vs ~55 us).
So when its process has a single request in flight, a thread first polls
for the reply for up to ``spin_us`` before it blocks: the CPU would idle
anyway, and the reply is usually there before the spin ends. Under load
(more than one request in flight) threads block at once and spend no CPU.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import zmq

from appliance.client.routing import Router, Target
from appliance.core.descriptor import DescriptorError, Message, from_frame, to_frame
from appliance.errors import DeadlineExceeded, WorkerLost

SLICE_MS = 50
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class Channel:
    """The sockets of one thread.

    Args:
        context: the process's ZeroMQ context.
        endpoint: maps (slot, generation) to the worker's endpoint.
        router: for instance liveness checks.
        on_stray: called with a message no pending request of this thread
            is waiting for (a late reply after a deadline); it must give
            back the message's ring blocks.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: Callable[[int, int], str],
        router: Router,
        on_stray: Callable[[Target, Message], None],
        spin_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._context = context
        self._endpoint = endpoint
        self._router = router
        self._on_stray = on_stray
        self._spin_s = spin_s
        self._sockets: dict[int, tuple[int, zmq.Socket[bytes]]] = {}
        self._timeouts: dict[zmq.Socket[bytes], int] = {}
        self._inbox: dict[int, deque[Message]] = {}
        self._closed = False

    def socket(self, target: Target) -> zmq.Socket[bytes]:
        """Return this thread's socket to ``target``, connecting if needed."""
        known = self._sockets.get(target.slot)
        if known is not None:
            generation, old = known
            if generation == target.generation:
                return old
            # The worker was replaced: messages queued for the old one must
            # never reach the new one, so drop them with the socket.
            self._timeouts.pop(old, None)
            old.close(0)
        socket: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, SLICE_MS)
        self._timeouts[socket] = SLICE_MS
        socket.connect(self._endpoint(target.slot, target.generation))
        self._sockets[target.slot] = (target.generation, socket)
        return socket

    def send(self, target: Target, message: Message) -> None:
        self.socket(target).send(to_frame(message), copy=True)

    def expect(self, request_id: int) -> None:
        """Start collecting messages for ``request_id``."""
        self._inbox[request_id] = deque()

    def forget(self, request_id: int) -> None:
        self._inbox.pop(request_id, None)

    def wait(self, target: Target, request_id: int, deadline: float) -> Message:
        """Block until a message for ``request_id`` arrives from ``target``.

        Raises:
            DeadlineExceeded: ``deadline`` (monotonic seconds, 0 = none) passed.
            WorkerLost: the instance died or was replaced meanwhile.
        """
        box = self._inbox[request_id]
        socket = self.socket(target)
        spin_s = self._spin_s()
        if spin_s and not box:
            self._spin(target, socket, box, time.perf_counter() + spin_s)
        while not box:
            timeout_ms = SLICE_MS
            if deadline:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise DeadlineExceeded("the request's deadline passed before a reply came")
                timeout_ms = min(timeout_ms, left_ms)
            if self._timeouts[socket] != timeout_ms:
                socket.setsockopt(zmq.RCVTIMEO, timeout_ms)
                self._timeouts[socket] = timeout_ms
            try:
                frame = socket.recv(copy=True)
            except zmq.Again:
                if not self._router.is_current(target):
                    raise WorkerLost(
                        f"the model worker (pid {target.pid}) holding this request exited; "
                        "the request may be retried"
                    ) from None
                continue
            self._route(target, frame)
        return box.popleft()

    def _spin(
        self, target: Target, socket: zmq.Socket[bytes], box: deque[Message], until: float
    ) -> None:
        while not box and time.perf_counter() < until:
            if cast(int, socket.getsockopt(_EVENTS)) & _POLLIN:
                self._route(target, socket.recv(copy=True))

    def _route(self, target: Target, frame: bytes) -> None:
        try:
            message = from_frame(frame)
        except DescriptorError:
            return
        box = self._inbox.get(message.request_id)
        if box is not None:
            box.append(message)
        else:
            self._on_stray(target, message)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _generation, socket in self._sockets.values():
            socket.close(0)
        self._sockets.clear()
        self._timeouts.clear()
