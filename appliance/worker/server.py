"""The model worker's serving loop: one thread, one PULL socket in, one model.

Each turn of the loop:

1. receive every message waiting on the socket (requests, releases, cancels);
2. run the next due batch and reply to each of its requests, with outputs
   written once into this worker's response ring;
3. advance each running stream by one part;
4. beat the heartbeat, and every second give back the ring space and the
   mappings held for clients that have died, and close the clients' GPU
   buffers whose regions were unregistered (cuda_regions.py).

One thread means a model never needs locks, and a model that holds the GIL
slows only its own instance.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import zmq

from appliance.config.scheduling import Scheduling
from appliance.core.descriptor import (
    Kind,
    Message,
    blocks_from,
    error_message,
    from_frames,
    place_tensors,
    read_tensors,
    ring_blocks,
)
from appliance.core.device_tensors import OPEN_REGION
from appliance.core.output_parameters import response_parameters_of
from appliance.core.ring import Block, Ring, is_spill
from appliance.core.status import Counter, SlotState, StatusTable
from appliance.core.tensor import Tensor
from appliance.errors import (
    ApplianceError,
    BadRequest,
    DeadlineExceeded,
    ErrorCode,
)
from appliance.observability.metrics import record_batch
from appliance.processes.lifetime import pid_alive
from appliance.worker import execute, methods, refusals, traces
from appliance.worker.batcher import (
    DERIVATIVES,
    STREAM,
    check_request,
)
from appliance.worker.client_gpu import ClientGpu
from appliance.worker.cuda_regions import CudaRegions
from appliance.worker.loader import Loaded
from appliance.worker.mappings import Mappings
from appliance.worker.outbox import Outbox, reply_to
from appliance.worker.own_slot import HEARTBEAT_S, OwnSlot
from appliance.worker.passthrough import borrowed_entries, input_spans
from appliance.worker.pending import Pending, Whole
from appliance.worker.pieces import answered, cut
from appliance.worker.plain import PlainRequests
from appliance.worker.queueing import Queueing, take_priority
from appliance.worker.reshape import Reshapes
from appliance.worker.sequences import (
    Sequences,
    SequenceSettings,
    batcher_for,
    refuse_sequence,
)
from appliance.worker.streams import Stream, Streams

log = logging.getLogger("appliance.worker")

# A stopping worker still serves requests routed to it just before its slot
# was marked STOPPING; it exits once it has been idle this long.
LINGER_S = 0.2
HOUSEKEEPING_S = 1.0
REPLY_HOLD_S = 0.0003
MAX_RECEIVE_PER_TURN = 512
# How long one loop turn may run due batches before it receives again.
RUN_TURN_S = 0.0005
HEARTBEAT_MS = int(HEARTBEAT_S * 1000)
# PERF: plain ints; pyzmq's flag enums cost microseconds per operation.
_RCVTIMEO = int(zmq.RCVTIMEO)
_NOBLOCK = int(zmq.NOBLOCK)
# PERF: the counters' indices as plain ints, for the per-batch counting.
_SUCCESS, _BATCHES, _BATCH_ROWS = (
    int(Counter.SUCCESS),
    int(Counter.BATCHES),
    int(Counter.BATCH_ROWS),
)
_QUEUE_NS, _COMPUTE_NS = int(Counter.QUEUE_NS), int(Counter.COMPUTE_NS)


class WorkerServer:
    """Serve one loaded model on one socket until told to stop.

    Args:
        loaded: the model and its metadata.
        socket: the bound PULL socket requests arrive on.
        reply_endpoint: where a client channel (pid, number) takes replies.
        ring: this worker's response ring.
        status: the tree's status table; ``slot`` is this instance's slot.
        inline_threshold: outputs up to this many bytes ride in the message.
    """

    def __init__(
        self,
        loaded: Loaded,
        socket: zmq.Socket[bytes],
        reply_endpoint: Callable[[int, int], str],
        ring: Ring,
        status: StatusTable,
        slot: int,
        inline_threshold: int,
        max_queue_delay_s: float,
        passthrough: bool = True,
        max_queue: int = 1024,
        sequences: SequenceSettings | None = None,
        cuda_regions: CudaRegions | None = None,
        scheduling: Scheduling | None = None,
        reshapes: Reshapes | None = None,
    ) -> None:
        self.model = loaded.model
        self.metadata = loaded.metadata
        self.socket = socket
        self.ring = ring
        self.outbox = Outbox(socket.context, reply_endpoint, ring)
        self.status = status
        self.slot = slot
        self.inline_threshold = inline_threshold
        self.passthrough = passthrough
        self.max_queue = max_queue
        self.sequences = Sequences(sequences) if sequences else None
        preferred = scheduling.preferred_batch_sizes if scheduling else ()
        self.batcher = batcher_for(
            loaded.max_batch_size, max_queue_delay_s, self.sequences, preferred
        )
        self.queueing = None if scheduling is None else Queueing(scheduling, loaded.metadata.name)
        self.reshapes = reshapes
        # A sequence's steps are admitted by its Sequences, and a request's
        # priority picks its place in the queue: both on the general path.
        self.plain = (
            None
            if sequences is not None or scheduling is not None
            else PlainRequests.serving(loaded.metadata, self.model.per_request, passthrough)
        )
        self.streams = Streams(loaded.model, loaded.metadata, status, slot, self.sequences)
        self.mappings = Mappings()
        self.cuda = (
            None
            if cuda_regions is None
            else ClientGpu(
                cuda_regions,
                loaded.metadata,
                self.model.device,
                self.model.device_inputs,
                sequences is not None,
            )
        )
        self.stopping = False
        self._last_message = 0.0
        self.pid = os.getpid()
        self.own = OwnSlot(status, slot, ring, self.model.device)
        self._housekeeping_at = time.monotonic() + HOUSEKEEPING_S
        # How long the last batch computed: what holding replies for the next may cost.
        self._last_compute_s = 0.0
        self._poller = zmq.Poller()
        self._poller.register(socket, zmq.POLLIN)
        self._timeout_ms = -1  # the socket's RCVTIMEO: blocks for ever

    # -- the loop -------------------------------------------------------------

    def serve(self) -> None:
        """Run until :meth:`stop` is called and all accepted work is done."""
        self.status.set_state(self.slot, SlotState.READY, self.pid)
        batcher = self.batcher
        while not self._finished():
            wait = 0.0 if self.streams else batcher.wait_s(time.monotonic())
            if wait is None or wait >= 0.001:
                # Nothing due: wait in a receive for a message, or for the batch.
                self._receive(HEARTBEAT_MS if wait is None else int(min(wait, HEARTBEAT_S) * 1000))
            else:
                if wait > 0:
                    # PERF: ZeroMQ's waits count whole milliseconds, and polling
                    # out the rest of a batch's wait spun up to 1 ms of CPU per
                    # batch. What arrives meanwhile joins the batch all the same.
                    time.sleep(wait)
                self._receive(0)
            if self.queueing is not None and self.queueing.timed:
                self._expire(time.monotonic())
            self._run_due()
            self._step_streams()
            # The turn's other replies (refusals, stream parts): one frame per channel.
            self._flush_replies()
            self._tick()

    def _run_due(self) -> None:
        """Run the batches due now, for up to RUN_TURN_S: a model whose requests run
        one by one answers what the last receive brought before receiving again.

        PERF: a loop turn per batch cost such a model a receive (three calls
        into libzmq), the status upkeep and a look at the streams per request.
        """
        batcher = self.batcher
        began = time.monotonic()
        now = began
        while True:
            batch = batcher.take(now)
            if not batch:
                return
            self._run(batch)
            now = time.monotonic()
            if now - began >= RUN_TURN_S:
                return

    def stop(self) -> None:
        """Finish what was routed here; the loop ends once idle for LINGER_S."""
        self.stopping = True
        self._last_message = time.monotonic()
        self.status.set_state(self.slot, SlotState.STOPPING)

    def _finished(self) -> bool:
        if not self.stopping or self.batcher or self.streams:
            return False
        return time.monotonic() - self._last_message >= LINGER_S

    def _tick(self) -> None:
        now = time.monotonic()
        self.own.show(len(self.batcher) + len(self.streams), now)
        if now >= self._housekeeping_at:
            self._housekeeping_at = now + HOUSEKEEPING_S
            self._drop_dead_clients()
            self.own.show_device_memory()
            if self.cuda is not None:
                self.cuda.regions.sweep()
            if self.sequences is not None:
                for sequence in self.sequences.expire(now):
                    log.info("dropped sequence %r: idle past max_sequence_idle_s", sequence)

    # -- messages -------------------------------------------------------------

    def _receive(self, timeout_ms: int) -> None:
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
        elif self._poller.poll(0):
            frame = socket.recv(_NOBLOCK)
        else:
            return
        self._last_message = time.monotonic()
        for _ in range(MAX_RECEIVE_PER_TURN):
            try:
                messages = from_frames(frame)
            except ValueError as ex:
                log.warning("dropped a malformed message: %s", ex)
                messages = []
            for message in messages:
                self._take(message)
            if not self._poller.poll(0):
                return
            frame = socket.recv(_NOBLOCK)

    def _take(self, message: Message) -> None:
        if message.kind is Kind.INFER:
            self._accept(message)
        elif message.kind is Kind.RELEASE:
            self.outbox.release(message.pid, blocks_from(message.body.get("blocks", [])))
        elif message.kind is Kind.CANCEL:
            self._cancel(message.pid, message.request_id)
        elif message.kind is Kind.GOODBYE:
            self.outbox.forget_channel((message.pid, message.channel))

    def _accept(self, message: Message) -> None:
        if len(self.batcher) >= self.max_queue:
            # Refused before its tensors are mapped: a full queue costs no memory.
            queued = len(self.batcher)
            name = self.metadata.name
            self._fail(message, refusals.queue_full(name, self.pid, queued, self.max_queue))
            return
        if message.body.get("method") == OPEN_REGION:
            self._open_region(message)
            return
        try:
            pending = self._pending(message)
        except ApplianceError as ex:
            self._fail(message, ex)
            return
        unanswerable = refusals.unanswerable(self.metadata, pending.method)
        if unanswerable is not None:
            self._fail_pending(pending, unanswerable)
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
            self._fail_pending(pending, error)
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

    def _expire(self, now: float) -> None:
        """Refuse the requests whose wait in the queue ran out (their queue policy's)."""
        assert self.queueing is not None
        for pending in self.batcher.expire(now):
            self._fail_pending(pending, self.queueing.timed_out(pending, now))

    def _open_region(self, message: Message) -> None:
        """Open a client's CUDA region (a registration's check); reply with its size."""
        try:
            if self.cuda is None:
                raise BadRequest("this model worker serves no CUDA shared memory")
            reply = self.cuda.open_region(message, self.pid)
        except ApplianceError as ex:
            self._fail(message, ex)
            return
        self.outbox.send(reply, reply_to(message), [])

    def _admit(self, pending: Pending) -> None:
        """Attach a step to its sequence, or refuse sequence parameters (sequences.py)."""
        if self.sequences is None:
            refuse_sequence(self.metadata.name, pending)
        else:
            self.sequences.admit(pending, time.monotonic())

    def _cancel(self, pid: int, request_id: int) -> None:
        for stream in self.streams:
            if stream.pending.message.pid == pid and stream.pending.request_id == request_id:
                self._end_stream(stream, None)
        self.batcher.drop(lambda p: p.message.pid == pid and p.request_id == request_id)

    def close(self) -> None:
        """Close every reply socket, flushing what it holds, and unmap segments;
        the last counters are written first."""
        self.own.flush_counts(time.monotonic())
        self.outbox.close()
        self.mappings.close()
        if self.cuda is not None:
            self.cuda.regions.close()

    # -- running work ---------------------------------------------------------

    def _run(self, batch: list[Pending]) -> None:
        now = time.monotonic()
        live = []
        for pending in batch:
            deadline = pending.message.deadline
            if deadline and now > deadline:
                waited_ms = (now - pending.arrived) * 1000
                self._fail_pending(
                    pending,
                    DeadlineExceeded(
                        f"request to model {self.metadata.name} passed its deadline after "
                        f"waiting {waited_ms:.1f} ms in the queue"
                    ),
                )
            else:
                live.append(pending)
        if not live:
            return
        # SAFETY: the running batch counts as queued, or a drain could
        # see an idle worker while this batch still owes its replies.
        self.own.set_depth_now(len(self.batcher) + len(live) + len(self.streams))
        head = live[0]
        if head.method == STREAM:
            self._start_stream(head)
        elif head.method in DERIVATIVES:
            self._finish(head, lambda: methods.derivative(self.model, self.metadata, head))
        else:
            self._predict(live, now)
        # The batch's outputs (views of its inputs, for a pass-through) are gone
        # now: a one-off segment's memory comes back once nothing maps it.
        self.mappings.retry()

    def _predict(self, batch: list[Pending], started: float) -> None:
        self.own.beat(started, busy_since=started)
        begin = time.perf_counter_ns()
        try:
            results = self._results(batch)
        except Exception as ex:
            error = refusals.as_error(self.metadata.name, ex)
            for pending in batch:
                self._fail_pending(pending, error)
            return
        finally:
            compute_ns = time.perf_counter_ns() - begin
            self.own.beat(time.monotonic())
        self._last_compute_s = compute_ns / 1e9
        for pending in batch:
            if pending.trace is not None:
                ended_ns = time.time_ns()  # spans are on the wall clock
                traces.batch_ran(self.metadata.name, batch, ended_ns - compute_ns, ended_ns)
                break
        failed = 0
        for pending, outputs in zip(batch, results, strict=True):
            if isinstance(outputs, ApplianceError):
                self._fail_pending(pending, outputs)
                failed += pending.whole is None
                continue
            if pending.whole is None:
                self._reply(pending, Kind.REPLY, outputs)
                continue
            if pending.whole.failed:
                continue
            joined = answered(pending, outputs)
            if joined is not None:
                self._reply(pending.whole.pending, Kind.REPLY, joined)
                self.own.count(Counter.SUCCESS)
        # The batch's replies go now, one frame per channel, before the counting.
        self._flush_replies()
        self._count(batch, started, compute_ns, failed)

    def _results(self, batch: list[Pending]) -> list[dict[str, Tensor] | ApplianceError]:
        """Run the batch; each request's outputs, or (a per-request model) its error."""
        model, sequences, cuda = self.model, self.sequences, self.cuda
        return execute.results(model, self.metadata, batch, sequences, cuda, self.reshapes)

    def _count(
        self, batch: list[Pending], started: float, compute_ns: int, failed: int = 0
    ) -> None:
        waits = []
        rows = answered = 0
        for pending in batch:
            waits.append(started - pending.arrived)
            rows += pending.rows or 1
            # A piece of a larger request counts once its whole request is answered.
            answered += pending.whole is None
        counts = self.own.counts
        counts[_SUCCESS] += answered - failed
        counts[_BATCHES] += 1
        counts[_BATCH_ROWS] += rows
        counts[_QUEUE_NS] += max(0, int(sum(waits) * 1e9))
        counts[_COMPUTE_NS] += compute_ns
        self.own.counted()
        record_batch(self.metadata.name, rows, waits, compute_ns / 1e9)

    def _finish(self, pending: Pending, compute: Any) -> None:
        started = time.monotonic()
        begin = time.perf_counter_ns()
        self.own.beat(started, busy_since=started)  # for the hang watchdog
        try:
            outputs = compute()
        except Exception as ex:
            self._fail_pending(pending, refusals.as_error(self.metadata.name, ex))
            return
        finally:
            self.own.beat(time.monotonic())
        self._reply(pending, Kind.REPLY, outputs)
        self._flush_replies()
        self._count([pending], started, time.perf_counter_ns() - begin)

    def _start_stream(self, pending: Pending) -> None:
        try:
            self.streams.start(pending)
        except Exception as ex:
            self._fail_pending(pending, refusals.as_error(self.metadata.name, ex))

    def _step_streams(self) -> None:
        for stream, step in self.streams.step():
            if step is None or isinstance(step, Exception):
                self._end_stream(
                    stream, None if step is None else refusals.as_error(self.metadata.name, step)
                )
            else:
                self._reply(stream.pending, Kind.PART, step, finished=False)

    def _end_stream(self, stream: Stream, error: ApplianceError | None) -> None:
        self.streams.close(stream)
        pending = stream.pending
        if error is None:
            self._reply(pending, Kind.END, {})
            self.own.count(Counter.SUCCESS)
        else:
            self._fail_pending(pending, error, kind=Kind.END)

    # -- replies --------------------------------------------------------------

    def _flush_replies(self) -> None:
        """Send the replies made so far; under load, once the queued work due now is done.

        PERF: with requests waiting, each batch's replies going at once cost a send
        and a wake-up of both sides' ZeroMQ I/O threads and of the client's loop per
        batch; held while the next batch is due, a channel's replies go as one frame.
        REPLY_HOLD_S bounds what the first of them waits, the next batch's compute
        (guessed from the last one's) included: a model slower than that never holds.
        """
        outbox, now = self.outbox, time.monotonic()
        waited = now - outbox.holding_since + self._last_compute_s
        if outbox.holding_since and waited < REPLY_HOLD_S and self.batcher.wait_s(now) == 0:
            return
        outbox.flush()

    def _reply(
        self, pending: Pending, kind: Kind, outputs: dict[str, Tensor], finished: bool = True
    ) -> None:
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
            self._fail_pending(pending, ex, kind=Kind.END if kind is Kind.PART else kind)
            return
        body: dict[str, Any] = {"tensors": entries}
        if borrowed:
            placed = iter(entries)
            body["tensors"] = [borrowed.get(name) or next(placed) for name in outputs]
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

    def _fail_pending(
        self, pending: Pending, error: ApplianceError, kind: Kind = Kind.REPLY
    ) -> None:
        if pending.whole is not None:
            self._fail_whole(pending.whole, error)
            return
        self._fail(pending.message, error, kind)
        self._done_with(pending)

    def _fail_whole(self, whole: Whole, error: ApplianceError) -> None:
        """The first failed piece fails its request; the pieces still queued go."""
        if whole.failed:
            return
        whole.failed = True
        self.batcher.drop(lambda p: p.whole is whole)
        self._fail_pending(whole.pending, error)

    def _fail(
        self,
        request: Message,
        error: ApplianceError,
        kind: Kind = Kind.REPLY,
    ) -> None:
        if error.code is not ErrorCode.BAD_REQUEST:
            self.own.count(Counter.FAIL)
        reply = error_message(kind, request.request_id, self.pid, error.code, error.message)
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

    # -- clients that died ----------------------------------------------------

    def _drop_dead_clients(self) -> None:
        self.mappings.retry()
        owners = self.outbox.owners() | self.mappings.owners()
        for pid in owners:
            if pid_alive(pid):
                continue
            self.outbox.drop_client(pid)
            for stream in [s for s in self.streams if s.pending.message.pid == pid]:
                self._end_stream(stream, BadRequest("client went away"))
            self.batcher.drop(lambda p, dead=pid: p.message.pid == dead)
            self.mappings.drop_owner(pid)
