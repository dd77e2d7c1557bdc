"""One thread's sockets to the model workers, and waiting for replies on them.

ZeroMQ sockets are not thread-safe, and handing every request to a dispatch
thread would add two wake-ups (~50 us on this machine kind) to each round
trip. So each thread that calls the client owns a channel: one PUSH socket
per instance it sends to, and one PULL socket, bound at the channel's own
endpoint, where every worker sends its replies. PERF: PUSH/PULL rather than
DEALER/ROUTER: on this machine kind a send that wakes libzmq's I/O thread
costs ~9 us on a PUSH socket against ~17 us on a DEALER and ~30 us for a
ROUTER reply, and a round trip makes two.

A thread waits in a blocking receive bounded by a short slice (RCVTIMEO);
between slices it checks the deadline and the instance's generation in the
status table, so a worker that dies fails its requests within one slice
instead of leaving them hanging.

PERF: on this machine kind an idle vCPU halts at once, and waking it costs
more than a small request's whole round trip (LIMITS.md: ~110 us vs ~55 us).
So when its process has a single request in flight, a thread first polls
for the reply for up to ``spin_us`` before it blocks: the CPU would idle
anyway, and the reply is usually there before the spin ends. Under load
threads block at once and spend no CPU: with more than one request in
flight in the process, or while replies have lately taken longer than the
spin (many client processes on a busy host, or a slow model), when a spin
would burn a CPU that the model worker needs.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import zmq

from appliance.client.routing import Router, Target, lost_sequence
from appliance.core.descriptor import DescriptorError, Kind, Message, from_frames, to_frame
from appliance.core.zmq_send import NOBLOCK, send_frame
from appliance.errors import DeadlineExceeded, WorkerLost

SLICE_MS = 50
# A stream's parts its consumer has not taken (a slow client) stop here: at
# HIGH_PARTS its worker is asked to pause the stream, at LOW_PARTS to go on.
# So a stream holds at most about HIGH_PARTS parts (and their ring blocks) in
# its frontend, however far behind its client falls.
HIGH_PARTS = 16
LOW_PARTS = 4
# Weight of the newest wait in the moving average: about the last eight count.
WAIT_WEIGHT = 0.125
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
BoxT = TypeVar("BoxT", bound=deque[Any])


def worker_lost(target: Target) -> WorkerLost:
    if target.sequence is not None:
        return lost_sequence(target)
    return WorkerLost(
        f"the model worker (pid {target.pid}) holding this request exited; "
        "the request may be retried"
    )


class PushSockets:
    """A channel's PUSH sockets: one per model instance it sends to.

    Args:
        context: the process's ZeroMQ context.
        endpoint: maps (slot, generation) to a worker's endpoint.
    """

    def __init__(self, context: zmq.Context[Any], endpoint: Callable[[int, int], str]) -> None:
        self._context = context
        self._endpoint = endpoint
        self._sockets: dict[int, tuple[int, zmq.Socket[bytes]]] = {}

    def get(self, target: Target) -> zmq.Socket[bytes]:
        """Return the socket to ``target``, connecting if needed."""
        known = self._sockets.get(target.slot)
        if known is not None:
            generation, old = known
            if generation == target.generation:
                return old
            # The worker was replaced: messages queued for the old one must
            # never reach the new one, so drop them with the socket.
            old.close(0)
        socket: zmq.Socket[bytes] = self._context.socket(zmq.PUSH)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self._endpoint(target.slot, target.generation))
        self._sockets[target.slot] = (target.generation, socket)
        return socket

    def close(self, channel: int) -> None:
        """Tell every worker to forget ``channel`` (no more replies), then close."""
        for _generation, socket in self._sockets.values():
            with contextlib.suppress(zmq.ZMQError):
                goodbye = Message(Kind.GOODBYE, 0, os.getpid(), channel=channel)
                socket.send(to_frame(goodbye), zmq.NOBLOCK)
            socket.close(0)
        self._sockets.clear()


@dataclass(frozen=True, slots=True)
class Wiring:
    """What every channel of a client is built from.

    Args:
        context: the process's ZeroMQ context.
        reply_endpoint: maps a channel's number to where it receives replies.
        endpoint: maps (slot, generation) to a worker's endpoint.
        router: for instance liveness checks.
        on_stray: called with a message no pending request of the channel
            waits for (a late reply after a deadline, a part left untaken);
            it must give back the message's ring blocks.
    """

    context: zmq.Context[Any]
    reply_endpoint: Callable[[int], str]
    endpoint: Callable[[int, int], str]
    router: Router
    on_stray: Callable[[Message], None]


@dataclass(slots=True)
class _Flow:
    """A stream's worker, and whether it was asked to pause the stream."""

    target: Target
    paused: bool = False


class ReplySockets(Generic[BoxT]):
    """What both channel kinds share: the PUSH sockets, the bound PULL, the boxes.

    Args:
        wiring: the client's sockets and callbacks.
        number: this channel's number in its process (sent with requests).
    """

    def __init__(self, wiring: Wiring, number: int) -> None:
        self.number = number
        self._router = wiring.router
        self._on_stray = wiring.on_stray
        self._pushes = PushSockets(wiring.context, wiring.endpoint)
        # A request's box holds the messages its waiter has not taken yet:
        # one reply for a unary call, parts for a stream.
        self._inbox: dict[int, BoxT] = {}
        # The streams whose parts are kept within HIGH_PARTS (see watch).
        self._flows: dict[int, _Flow] = {}
        self._pid = os.getpid()
        self._replies: zmq.Socket[bytes] = wiring.context.socket(zmq.PULL)
        self._replies.setsockopt(zmq.LINGER, 0)
        self._replies.bind(wiring.reply_endpoint(number))
        self._closed = False

    def send(self, target: Target, message: Message, flags: int = 0) -> None:
        message.channel = self.number
        send_frame(self._pushes.get(target), to_frame(message), flags)

    def watch(self, request_id: int, target: Target) -> None:
        """Keep the untaken parts of the stream ``request_id`` (sent to ``target``)
        within HIGH_PARTS: its worker pauses the stream while its box is full."""
        self._flows[request_id] = _Flow(target)

    def forget(self, request_id: int) -> None:
        """Stop collecting messages for ``request_id``."""
        if self._flows:
            self._flows.pop(request_id, None)
        box = self._inbox.pop(request_id, None)
        if box:
            # Parts a stream's consumer left untaken still hold ring space.
            for item in box:
                if isinstance(item, Message):
                    self._on_stray(item)

    def _route(self, frame: bytes) -> None:
        try:
            messages = from_frames(frame)
        except DescriptorError:
            return
        inbox = self._inbox
        for message in messages:
            box = inbox.get(message.request_id)
            if box is not None:
                box.append(message)
                if len(box) >= HIGH_PARTS:
                    self._pace(message.request_id, True)
            else:
                self._on_stray(message)

    def _taken(self, request_id: int, box: BoxT) -> None:
        """A message was taken out of ``box``: a paused stream goes on once it ran low."""
        if self._flows and len(box) <= LOW_PARTS:
            self._pace(request_id, False)

    def _pace(self, request_id: int, pause: bool) -> None:
        flow = self._flows.get(request_id)
        if flow is None or flow.paused == pause:
            return
        flow.paused = pause
        message = Message(Kind.PAUSE if pause else Kind.RESUME, request_id, self._pid)
        message.channel = self.number
        # A worker that went away ends the stream by other ways (WorkerLost).
        with contextlib.suppress(zmq.ZMQError):
            send_frame(self._pushes.get(flow.target), to_frame(message), NOBLOCK)

    def close(self) -> None:
        """Tell every worker this channel used to forget it, then close."""
        if self._closed:
            return
        self._closed = True
        self._pushes.close(self.number)
        self._replies.close(0)


class Channel(ReplySockets[deque[Message]]):
    """The sockets of one thread.

    Args:
        wiring: the client's sockets and callbacks.
        number: this channel's number in its process (sent with requests).
        spin_s: how long to poll before blocking, asked per wait.
    """

    def __init__(
        self, wiring: Wiring, number: int, spin_s: Callable[[], float] = lambda: 0.0
    ) -> None:
        super().__init__(wiring, number)
        self._spin_s = spin_s
        # Moving average of how long replies take: a spin pays only while they
        # usually come within it (see the module's PERF note).
        self._typical_wait_s = 0.0
        self._timeout_ms = SLICE_MS
        self._replies.setsockopt(zmq.RCVTIMEO, SLICE_MS)

    def expect(self, request_id: int) -> None:
        """Start collecting messages for ``request_id``."""
        self._inbox[request_id] = deque()

    def wait(self, target: Target, request_id: int, deadline: float) -> Message:
        """Block until a message for ``request_id`` arrives from ``target``.

        Raises:
            DeadlineExceeded: ``deadline`` (monotonic seconds, 0 = none) passed.
            WorkerLost: the instance died or was replaced meanwhile.
        """
        box = self._inbox[request_id]
        replies = self._replies
        spin_s = self._spin_s()
        started = time.perf_counter()
        if spin_s and not box and self._typical_wait_s < spin_s:
            self._spin(box, started + spin_s)
        while not box:
            timeout_ms = SLICE_MS
            if deadline:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise DeadlineExceeded("the request's deadline passed before a reply came")
                timeout_ms = min(timeout_ms, left_ms)
            if self._timeout_ms != timeout_ms:
                replies.setsockopt(zmq.RCVTIMEO, timeout_ms)
                self._timeout_ms = timeout_ms
            try:
                frame = replies.recv(copy=True)
            except zmq.Again:
                if not self._router.is_current(target):
                    raise worker_lost(target) from None
                continue
            self._route(frame)
        waited = time.perf_counter() - started
        self._typical_wait_s += (waited - self._typical_wait_s) * WAIT_WEIGHT
        message = box.popleft()
        self._taken(request_id, box)
        return message

    def _spin(self, box: deque[Message], until: float) -> None:
        replies = self._replies
        while not box and time.perf_counter() < until:
            if cast(int, replies.getsockopt(_EVENTS)) & _POLLIN:
                self._route(replies.recv(copy=True))
