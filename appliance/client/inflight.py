"""The requests a client process has in flight, and the ring space they hold.

A request's tensors are written once into this process's request ring; the
descriptor sent to a worker points at them. This module sends a request,
turns its reply into an :class:`InferResult` (views into the worker's
response ring), and gives every block back when it is no longer read: the
client's own blocks once the reply came (or the worker died), the worker's
blocks once the result is released. A request given up on (a deadline, a
cancelled caller) keeps its blocks in the abandoned table until its late
reply arrives, since the worker may still read them.

Nothing here waits: the calls in api.py wait for replies on a channel (a
thread's or an event loop's), through the drivers in drive.py. What a call
in flight is (call.py), what it answers (result.py) and how its body is
built (request.py) live apart: this module keeps the table and the ring.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from appliance.client.call import Call, Outbox
from appliance.client.request import TensorLike, tensor_of
from appliance.client.result import InferResult
from appliance.client.routing import Router, Target
from appliance.config.settings import ShmConfig
from appliance.core.client_memory import ClientTensor
from appliance.core.descriptor import Kind, Message
from appliance.core.message_tensors import (
    Placed,
    SegmentReader,
    block_list,
    leased_blocks,
    place_tensors,
    read_tensors,
    ring_blocks,
)
from appliance.core.ring import Block, Ring, is_spill, ring_segment
from appliance.core.segment import Segment
from appliance.core.status import StatusTable
from appliance.core.tensor import Tensor
from appliance.core.tree import owner_pid
from appliance.core.zmq_send import NOBLOCK
from appliance.errors import ShmExhausted, error_from_code
from appliance.processes.lifetime import pid_alive

log = logging.getLogger("appliance.client")


class InFlight:
    """This process's request ring and the table of its requests in flight.

    Args:
        router: instance states (is a target still the live one).
        status: where the in-flight count and ring use are published.
        publish_slot: the status slot to publish in (frontends have one).
        segment_name: the request ring's shared-memory name.
        ring_bytes: its size, or (where the master capped rings, see
            master/shm.py) the most it may take.
        shm: the config's limits (inline threshold, largest tensor, spills, smallest ring).
        outbox: the calling thread's channel, for giving blocks back.
    """

    def __init__(
        self,
        router: Router,
        status: StatusTable,
        publish_slot: int | None,
        segment_name: str,
        ring_bytes: int,
        shm: ShmConfig,
        outbox: Callable[[], Outbox],
    ) -> None:
        self.router = router
        self._status = status
        self._publish_slot = publish_slot
        # The in-flight count is written on every call: through precomputed offsets.
        self._depth = None if publish_slot is None else status.own(publish_slot)
        self._inline_threshold = shm.inline_threshold_bytes
        self._ring = request_ring(
            status.ring_size(ring_bytes, shm.min_ring_bytes),
            segment_name,
            shm.max_tensor_bytes,
            shm.spill_limit_bytes,
        )
        self._outbox = outbox
        self._lock = threading.Lock()
        # A one-off segment's memory stays taken while it is mapped, unlinked
        # or not: such a mapping is not kept, and goes with the last view of it.
        self._reader = SegmentReader(Segment.attach, keep=lambda name: not is_spill(name))
        self._ids = itertools.count(1)
        self._abandoned: dict[int, tuple[Target, list[Block], Callable[[], None] | None]] = {}
        self.count = 0
        self._held = 0
        self._pid = os.getpid()
        self._closed = False

    def send(
        self,
        channel: Outbox,
        target: Target,
        deadline: float,
        body: dict[str, Any],
        inputs: Mapping[str, TensorLike],
    ) -> Call:
        """Place ``inputs`` in the ring and send ``body`` with them to ``target``."""
        tensors = {name: tensor_of(name, value) for name, value in inputs.items()}
        payloads: list[Any] = []
        blocks: list[Block] = []
        try:
            body["tensors"] = place_tensors(tensors, self, self._inline_threshold, payloads, blocks)
        except BaseException:
            self._release_local(blocks)
            raise
        request_id = next(self._ids)
        # When it was sent (CLOCK_MONOTONIC, one clock for every process): its
        # time in the queue counts from here, not from when a busy worker reads it.
        body["sent"] = time.monotonic()
        message = Message(Kind.INFER, request_id, self._pid, body, payloads, deadline=deadline)
        channel.expect(request_id)
        self._adjust_count(+1)
        self.router.begin(target.slot)
        channel.send(target, message)
        return Call(channel, target, request_id, blocks, deadline)

    def settle(self, call: Call) -> InferResult:
        """Turn a unary call's reply into a result (or its error); end the call."""
        reply = call.reply
        if reply is None:  # the wait failed
            self.finish(call, False)
            reply = call.take()  # raises the wait's error
        kept: list[Block] = []
        try:
            _raise_for(reply)
            result, kept = self._result(call.target, reply, call.blocks, keep=True)
            return result
        finally:
            if kept:
                call.blocks = [block for block in call.blocks if block not in kept]
            self.finish(call, True)

    def part(self, call: Call) -> InferResult | None:
        """The stream part the last wait brought; None at the stream's end (or raise its error).

        The caller ends the stream (:meth:`end_stream`) whichever way this ends.
        """
        reply = call.take()
        if call.previous is not None:
            call.previous.release()
            call.previous = None
        if reply.kind is Kind.END:
            call.finished = True
            if reply.code:
                error = error_from_code(reply.code, reply.error_message, reply.error_status)
                error.ends_stream = True
                raise error
            return None
        if reply.code:
            # Refused before it started (a full queue, a sequence's step out of turn):
            # one reply, no parts.
            call.finished = True
            _raise_for(reply)
        # Parts may borrow request blocks; those stay until the stream ends.
        call.previous = self._result(call.target, reply, call.blocks)[0]
        return call.previous

    def end_stream(self, call: Call) -> None:
        """Release a stream's last part; cancel it in the worker if it did not end."""
        if call.previous is not None:
            call.previous.release()
        if not call.finished and self.router.is_current(call.target):
            with contextlib.suppress(zmq.ZMQError):
                call.channel.send(call.target, Message(Kind.CANCEL, call.id, self._pid))
        self.finish(call, call.finished)

    def finish(self, call: Call, answered: bool) -> None:
        """End a call: its blocks go back now, or when a late reply comes if unanswered."""
        target = call.target
        self.router.end(target.slot)
        self._adjust_count(-1)
        if answered:
            self._release_local(call.blocks)
        elif not self.router.is_current(target):
            self._release_local(call.blocks)
            if call.after is not None:
                call.after()
        elif call.blocks or call.after is not None:
            # SAFETY: the worker may still read these blocks; keep them until
            # its late reply arrives (see stray) or it dies.
            with self._lock:
                self._abandoned[call.id] = (target, call.blocks, call.after)
        # Last: a final message the caller left untaken is a late reply now.
        call.channel.forget(call.id)

    def _result(
        self, target: Target, reply: Message, sent: list[Block], keep: bool = False
    ) -> tuple[InferResult, list[Block]]:
        """Wrap a reply's outputs; return it and the request blocks it borrows.

        Outputs in the worker's ring are given back to it on release. Outputs
        that lie in this client's own request blocks (a model that passed an
        input through, see worker/passthrough.py) keep those blocks alive
        until release when ``keep`` is set.
        """
        body = reply.body
        entries = body.get("tensors", [])
        with self._lock:
            outputs = read_tensors(entries, reply.payloads, self._reader)
        mine = {block.segment for block in sent} if sent else ()
        # Outputs the worker passed through lie in a request's blocks, not in
        # its ring: this client's own, or (an ensemble's) another worker's.
        remote = [block for block in leased_blocks(body) if block.segment not in mine]
        kept: list[Block] = []
        if keep and sent:
            for block in ring_blocks(entries):
                if block.segment in mine:
                    kept += [b for b in sent if _contains(b, block) and b not in kept]
        if not remote and not kept:
            return InferResult(outputs, None, body), kept

        def release() -> None:
            if remote:
                self._release_remote(target, remote)
            self._release_local(kept)

        return InferResult(outputs, release, body), kept

    def _release_remote(self, target: Target, blocks: list[Block]) -> None:
        if self._closed or not self.router.is_current(target):
            return
        message = Message(Kind.RELEASE, 0, self._pid, {"blocks": block_list(blocks)})
        with contextlib.suppress(zmq.ZMQError):
            self._outbox().send(target, message, NOBLOCK)

    def stray(self, message: Message) -> None:
        """Take back what a reply nobody waits for still holds."""
        final = message.kind in (Kind.REPLY, Kind.END)
        with self._lock:
            abandoned = (self._abandoned.pop if final else self._abandoned.get)(
                message.request_id, None
            )
        target = abandoned[0] if abandoned else self.router.target_of(message.pid)
        if target is not None:
            self._release_remote(target, leased_blocks(message.body))
        if final and abandoned is not None:
            self._release_local(abandoned[1])
            if abandoned[2] is not None:
                abandoned[2]()
        self._sweep_abandoned()

    def _sweep_abandoned(self) -> None:
        with self._lock:
            gone = [
                rid for rid, (t, _b, _a) in self._abandoned.items() if not self.router.is_current(t)
            ]
            released = [self._abandoned.pop(rid) for rid in gone]
            dead = [name for name in self._reader.names() if not _owner_alive(name)]
            for name in dead:
                self._reader.forget(name)
        for _target, blocks, after in released:
            self._release_local(blocks)
            if after is not None:
                after()

    def place(self, tensor: Tensor | ClientTensor) -> Placed:
        """Write a tensor into the ring once, to be sent by reference (:meth:`release_placed`).

        Raises:
            TooLarge, Overloaded: from the ring; BadRequest: a client's file changed.
        """
        blocks: list[Block] = []
        try:
            place_tensors({"": tensor}, self, -1, [], blocks)
        except BaseException:
            self._release_local(blocks)
            raise
        return Placed(tensor.dtype, tuple(tensor.shape), blocks[0])

    def release_placed(self, placed: Placed) -> None:
        self._release_local([placed.block])

    # The two methods below make this table the thread-safe allocator that
    # place_tensors writes through.

    def alloc(self, nbytes: int) -> Block:
        with self._lock:
            block = self._ring.alloc(nbytes)
            self._publish_ring()
            return block

    def view(self, block: Block) -> memoryview:
        with self._lock:
            return self._ring.view(block)

    @property
    def ring_used_bytes(self) -> int:
        return self._ring.used_bytes + self._ring.spilled_bytes

    def _publish_ring(self) -> None:
        if self._publish_slot is not None:
            ring = self._ring
            self._status.set_ring(
                self._publish_slot, ring.used_bytes, ring.capacity, ring.spilled_bytes
            )

    def _release_local(self, blocks: list[Block]) -> None:
        if blocks:
            with self._lock:
                for block in blocks:
                    self._ring.release(block)
                self._publish_ring()

    def _adjust_count(self, delta: int) -> None:
        with self._lock:
            self.count += delta
            depth = self.count + self._held
        if self._depth is not None:
            self._depth.set_depth(depth)

    def hold(self, delta: int) -> None:
        """Count an ensemble running (+1) or done (-1) in the published depth.

        SAFETY: between two of its steps no call is in flight; a drain that
        looked then would see an idle frontend and stop the workers the next
        step needs. ``count`` (which decides a wait's spin) leaves it out.
        """
        with self._lock:
            self._held += delta
        self._adjust_count(0)

    def close(self) -> None:
        """Detach from the workers' rings and unlink this process's ring."""
        self._closed = True
        self._reader.close()
        self._ring.close()


def request_ring(size: tuple[int, int], name: str, max_tensor: int, spill_limit: int) -> Ring:
    """This process's request ring, ``size`` (wanted, floor) bytes or less.

    Where /dev/shm has no room for even the floor, the process still serves:
    tensors small enough to ride in descriptors need no ring, and the ring
    is made once there is room again (requests meanwhile get ShmExhausted).
    """

    def make() -> Segment:
        return ring_segment(name, size, "request")

    segment: Segment | None = None
    try:
        segment = make()
    except ShmExhausted as ex:
        log.error("no request ring yet, serving tensors inline only: %s", ex)
    hint = "shm.request_ring_bytes"
    return Ring(segment, name, max_tensor, spill_limit, limit_hint=hint, regrow=make)


def _contains(outer: Block, inner: Block) -> bool:
    return (
        outer.segment == inner.segment
        and outer.offset <= inner.offset
        and inner.offset + inner.nbytes <= outer.offset + outer.nbytes
    )


def _raise_for(reply: Message) -> None:
    if reply.code:
        raise error_from_code(reply.code, reply.error_message, reply.error_status)


def _owner_alive(segment_name: str) -> bool:
    pid = owner_pid(segment_name)
    return pid is None or pid_alive(pid)
