"""What arrives at a model worker: requests read, checked and queued; releases; cancels.

A request is refused before its tensors are mapped when the queue is full;
otherwise it is read (the plain path, plain.py, or the general one),
checked, attached to its sequence or its priority level, and queued, cut
into pieces when it holds more rows than a batch. Whatever is wrong with it
is answered at once. The other messages give back ring space, cancel a
request, pause or resume a stream, forget a client's channel, or open a
client's CUDA region.
"""

from __future__ import annotations

import logging
import time

import zmq

from appliance.core.descriptor import Kind, Message, from_frames
from appliance.core.device_tensors import OPEN_REGION
from appliance.core.message_tensors import blocks_from, read_tensors
from appliance.core.metadata import ModelMetadata
from appliance.core.zmq_send import NOBLOCK, poll
from appliance.errors import ApplianceError, BadRequest
from appliance.model import Model
from appliance.worker import refusals, traces
from appliance.worker.batcher import Batcher, check_request
from appliance.worker.client_gpu import ClientGpu
from appliance.worker.mappings import Mappings
from appliance.worker.outbox import Outbox, reply_to
from appliance.worker.passthrough import input_spans
from appliance.worker.pending import Pending
from appliance.worker.pieces import cut
from appliance.worker.plain import PlainRequests
from appliance.worker.queueing import Queueing, take_priority
from appliance.worker.replies import Replies
from appliance.worker.sequences import Sequences, refuse_sequence
from appliance.worker.stream_steps import StreamSteps

log = logging.getLogger("appliance.worker")

MAX_RECEIVE_PER_TURN = 512
# PERF: plain ints; pyzmq's flag enums cost microseconds per operation.
_RCVTIMEO = int(zmq.RCVTIMEO)


class Intake:
    """Take in the messages of one model instance's socket.

    Args:
        socket: the bound PULL socket requests arrive on.
        model: the loaded model.
        metadata: its declarations.
        batcher: the queue requests join.
        max_queue: the most requests (or pieces) the queue holds.
        plain: the fast admission, where the model has one (plain.py).
        queueing: the model's priority levels and queue policies, if any.
        mappings: the clients' segments this worker maps.
        cuda: the clients' GPU buffers, where this worker serves them.
        sequences: the live sequences, for a sequence model.
        passthrough: note where inputs lie, for outputs that are views of them.
        outbox: where a region's opening is answered, and ring space comes back.
        replies: where refusals go.
        stream_steps: what ends a cancelled stream.
        pid: this worker's process id.
    """

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        model: Model,
        metadata: ModelMetadata,
        batcher: Batcher,
        max_queue: int,
        plain: PlainRequests | None,
        queueing: Queueing | None,
        mappings: Mappings,
        cuda: ClientGpu | None,
        sequences: Sequences | None,
        passthrough: bool,
        outbox: Outbox,
        replies: Replies,
        stream_steps: StreamSteps,
        pid: int,
    ) -> None:
        self.socket = socket
        self.model = model
        self.metadata = metadata
        self.batcher = batcher
        self.max_queue = max_queue
        self.plain = plain
        self.queueing = queueing
        self.mappings = mappings
        self.cuda = cuda
        self.sequences = sequences
        self.passthrough = passthrough
        self.outbox = outbox
        self.replies = replies
        self.stream_steps = stream_steps
        self.pid = pid
        # When the last message arrived: a stopping worker lingers after it.
        self.last_message = 0.0
        self._polled = [(socket, int(zmq.POLLIN))]
        self._timeout_ms = -1  # the socket's RCVTIMEO: blocks for ever

    def receive(self, timeout_ms: int) -> None:
        """Take the waiting messages, waiting up to ``timeout_ms`` for the first.

        All of them, before the next batch runs, even for a model whose
        requests run one by one: besides joining batches, requests taken
        into the queue meet ``max_queue`` and are refused with Overloaded.
        Left in the socket, they would fill ZeroMQ's queues until the
        frontends' sends block.

        PERF: the wait is a receive with a timeout (one poll and one read in
        libzmq), not a poll and then a receive (four polls); whether more is
        waiting is a zero-timeout poll, which costs a third of an exception
        from an empty receive and half of reading the socket's EVENTS.
        """
        socket = self.socket
        if timeout_ms:
            if timeout_ms != self._timeout_ms:
                socket.setsockopt(_RCVTIMEO, timeout_ms)
                self._timeout_ms = timeout_ms
            try:
                frame = socket.recv()
            except zmq.Again:
                return
        elif poll(self._polled, 0):
            frame = socket.recv(NOBLOCK)
        else:
            return
        self.last_message = time.monotonic()
        for _ in range(MAX_RECEIVE_PER_TURN):
            try:
                messages = from_frames(frame)
            except ValueError as ex:
                log.warning("dropped a malformed message: %s", ex)
                messages = []
            for message in messages:
                self._take(message)
            if not poll(self._polled, 0):
                return
            frame = socket.recv(NOBLOCK)

    def _take(self, message: Message) -> None:
        if message.kind is Kind.INFER:
            self._accept(message)
        elif message.kind is Kind.RELEASE:
            self.outbox.release(message.pid, blocks_from(message.body.get("blocks", [])))
        elif message.kind is Kind.CANCEL:
            self._cancel(message.pid, message.request_id)
        elif message.kind is Kind.GOODBYE:
            self.outbox.forget_channel((message.pid, message.channel))
        elif message.kind is Kind.PAUSE or message.kind is Kind.RESUME:
            paused = message.kind is Kind.PAUSE
            self.stream_steps.streams.pause(message.pid, message.request_id, paused)

    def _accept(self, message: Message) -> None:
        if len(self.batcher) >= self.max_queue:
            # Refused before its tensors are mapped: a full queue costs no memory.
            queued = len(self.batcher)
            name = self.metadata.name
            self.replies.fail(message, refusals.queue_full(name, self.pid, queued, self.max_queue))
            return
        if message.body.get("method") == OPEN_REGION:
            self._open_region(message)
            return
        try:
            pending = self._pending(message)
        except ApplianceError as ex:
            self.replies.fail(message, ex)
            return
        unanswerable = refusals.unanswerable(self.metadata, pending.method)
        if unanswerable is not None:
            self.replies.fail_pending(pending, unanswerable)
            return
        max_rows = self.batcher.max_batch_size
        if pending.key is None or pending.rows <= max_rows:
            self.batcher.add(pending)
            return
        pieces = cut(pending, max_rows)
        if len(self.batcher) + len(pieces) > self.max_queue:
            name, rows, queued = self.metadata.name, pending.rows, len(self.batcher)
            error = refusals.too_many_pieces(
                name, self.pid, rows, len(pieces), max_rows, queued, self.max_queue
            )
            self.replies.fail_pending(pending, error)
            return
        for piece in pieces:
            self.batcher.add(piece)

    def _pending(self, message: Message) -> Pending:
        """The checked request a message carries, placed where its inputs lie.

        Raises:
            ApplianceError: what is wrong with it, or why it cannot queue.
        """
        body = message.body
        plain = self.plain
        pending = None if plain is None else plain.take(message, self.mappings.reader)
        if pending is not None:
            if "trace" in body:
                traces.accepted(pending)
            return pending
        level = 0
        priority = take_priority(body)
        if self.queueing is not None:
            level = self.queueing.level(priority)
        pending = self._checked(message)
        if "trace" in body:
            traces.accepted(pending)
        if self.queueing is not None:
            self.queueing.place(pending, level, self.batcher)
        return pending

    def _checked(self, message: Message) -> Pending:
        """:meth:`_pending`'s general path: any request, every error named (see plain.py).

        Raises:
            ApplianceError: what is wrong with it, or why it cannot queue.
        """
        entries = message.body.get("tensors", [])
        tensors = read_tensors(entries, message.payloads, self.mappings.reader)
        pending = check_request(self.metadata, message, tensors, self.model.per_request)
        if ClientGpu.names_any(message):
            if self.cuda is None:
                raise BadRequest("this model worker serves no CUDA shared memory")
            self.cuda.place_inputs(pending, entries, self.batcher.max_batch_size)
        self._admit(pending)
        if self.passthrough:
            pending.spans = input_spans(entries, self.mappings.reader)
        return pending

    def expire(self, now: float) -> None:
        """Refuse the requests whose wait in the queue ran out (their queue policy's)."""
        assert self.queueing is not None
        for pending in self.batcher.expire(now):
            self.replies.fail_pending(pending, self.queueing.timed_out(pending, now))

    def _open_region(self, message: Message) -> None:
        """Open a client's CUDA region (a registration's check); reply with its size."""
        try:
            if self.cuda is None:
                raise BadRequest("this model worker serves no CUDA shared memory")
            reply = self.cuda.open_region(message, self.pid)
        except ApplianceError as ex:
            self.replies.fail(message, ex)
            return
        self.outbox.send(reply, reply_to(message), [])

    def _admit(self, pending: Pending) -> None:
        """Attach a step to its sequence, or refuse sequence parameters (sequences.py)."""
        if self.sequences is None:
            refuse_sequence(self.metadata.name, pending)
        else:
            self.sequences.admit(pending, time.monotonic())

    def _cancel(self, pid: int, request_id: int) -> None:
        for stream in self.stream_steps.streams:
            if stream.pending.message.pid == pid and stream.pending.request_id == request_id:
                self.stream_steps.end(stream, None)
        self.batcher.drop(lambda p: p.message.pid == pid and p.request_id == request_id)
