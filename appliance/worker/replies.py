"""A model worker's replies: outputs placed for the client, errors, and when they go.

A reply's outputs are written once into the worker's response ring (or
ride inline, or are views of the request's own inputs for a pass-through,
or go into the client's GPU buffers); it waits in the outbox (outbox.py)
until :meth:`Replies.flush` sends the turn's replies, one frame per
channel. A request answered is done with: its views are dropped and its
one-off segments unmapped.
"""

from __future__ import annotations

import time
from typing import Any

from appliance.core.descriptor import Kind, Message, error_message
from appliance.core.message_tensors import add_parameters, place_tensors, ring_blocks
from appliance.core.output_parameters import response_parameters_of
from appliance.core.ring import Block, Ring, is_spill
from appliance.core.status import Counter
from appliance.core.tensor import Tensor
from appliance.errors import ApplianceError, ErrorCode
from appliance.worker import traces
from appliance.worker.batcher import Batcher
from appliance.worker.client_gpu import ClientGpu
from appliance.worker.mappings import Mappings
from appliance.worker.outbox import Outbox, reply_to
from appliance.worker.own_slot import OwnSlot
from appliance.worker.passthrough import borrowed_entries
from appliance.worker.pending import Pending, Whole

REPLY_HOLD_S = 0.0003


class Replies:
    """Answer the requests of one model instance.

    Args:
        outbox: where replies wait for :meth:`flush`.
        ring: this worker's response ring.
        inline_threshold: outputs up to this many bytes ride in the message.
        own: this instance's status slot, which counts the failures.
        batcher: the queue: a failed request's pieces leave it, and replies
            are held while a batch is due.
        mappings: the clients' segments this worker maps.
        cuda: the clients' GPU buffers, where this worker serves them.
        pid: this worker's process id, which every reply carries.
    """

    def __init__(
        self,
        outbox: Outbox,
        ring: Ring,
        inline_threshold: int,
        own: OwnSlot,
        batcher: Batcher,
        mappings: Mappings,
        cuda: ClientGpu | None,
        pid: int,
    ) -> None:
        self.outbox = outbox
        self.ring = ring
        self.inline_threshold = inline_threshold
        self.own = own
        self.batcher = batcher
        self.mappings = mappings
        self.cuda = cuda
        self.pid = pid
        # How long the last batch computed: what holding replies for the next may cost.
        self.last_compute_s = 0.0

    def flush(self) -> None:
        """Send the replies made so far; under load, once the queued work due now is done.

        PERF: with requests waiting, each batch's replies going at once cost a send
        and a wake-up of both sides' ZeroMQ I/O threads and of the client's loop per
        batch; held while the next batch is due, a channel's replies go as one frame.
        REPLY_HOLD_S bounds what the first of them waits, the next batch's compute
        (guessed from the last one's) included: a model slower than that never holds.
        """
        outbox, now = self.outbox, time.monotonic()
        waited = now - outbox.holding_since + self.last_compute_s
        if outbox.holding_since and waited < REPLY_HOLD_S and self.batcher.wait_s(now) == 0:
            return
        outbox.flush()

    def reply(
        self, pending: Pending, kind: Kind, outputs: dict[str, Tensor], finished: bool = True
    ) -> None:
        """Answer ``pending`` with ``outputs`` (a stream's part when not ``finished``)."""
        payloads: list[Any] = []
        blocks: list[Block] = []
        borrowed = borrowed_entries(outputs, pending.spans) if pending.spans else {}
        try:
            if pending.targets and self.cuda is not None:
                borrowed.update(self.cuda.to_client(pending, outputs))
            copied = (
                {n: t for n, t in outputs.items() if n not in borrowed} if borrowed else outputs
            )
            entries = place_tensors(copied, self.ring, self.inline_threshold, payloads, blocks)
        except ApplianceError as ex:
            for block in blocks:
                self.ring.release(block)
            self.fail_pending(pending, ex, kind=Kind.END if kind is Kind.PART else kind)
            return
        body: dict[str, Any] = {"tensors": entries}
        if borrowed:
            placed = iter(entries)
            tensors = [borrowed.get(name) or next(placed) for name in outputs]
            # place_tensors saw a plain dict of the rest: every entry's parameters go here.
            body["tensors"] = add_parameters(tensors, outputs)
            # SAFETY: not this worker's blocks; the client must not give them back here.
            body["borrowed"] = list(borrowed)
        response = response_parameters_of(outputs)
        if response:
            body["parameters"] = response
        message = Message(kind, pending.request_id, self.pid, body, payloads)
        self.outbox.send(message, reply_to(pending.message), blocks)
        if pending.trace is not None and finished:
            traces.replied(pending)
        if finished:
            self._done_with(pending)

    def fail_pending(
        self, pending: Pending, error: ApplianceError, kind: Kind = Kind.REPLY
    ) -> None:
        """Answer a queued request (or the whole request a piece is of) with ``error``."""
        if pending.whole is not None:
            self._fail_whole(pending.whole, error)
            return
        self.fail(pending.message, error, kind)
        self._done_with(pending)

    def _fail_whole(self, whole: Whole, error: ApplianceError) -> None:
        """The first failed piece fails its request; the pieces still queued go."""
        if whole.failed:
            return
        whole.failed = True
        self.batcher.drop(lambda p: p.whole is whole)
        self.fail_pending(whole.pending, error)

    def fail(
        self,
        request: Message,
        error: ApplianceError,
        kind: Kind = Kind.REPLY,
    ) -> None:
        """Answer a message with ``error``; a client's own mistake is no failure of the model's."""
        if error.code is not ErrorCode.BAD_REQUEST:
            self.own.count(Counter.FAIL)
        reply = error_message(
            kind, request.request_id, self.pid, error.code, error.message, error.status
        )
        self.outbox.send(reply, reply_to(request), [])

    def _done_with(self, pending: Pending) -> None:
        """Drop a finished request's views and unmap its one-off segments."""
        pending.arrays.clear()
        pending.message.payloads.clear()
        spills = [
            block.segment
            for block in ring_blocks(pending.message.body.get("tensors", ()))
            if is_spill(block.segment)
        ]
        if spills:
            self.mappings.unmap(spills)
