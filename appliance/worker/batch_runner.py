"""Running a model worker's due batches: predictions, derivatives, the start of a stream.

Each batch is run on the model, each of its requests answered (replies.py),
and the batch counted in the instance's status slot and the metrics; a
request whose deadline passed in the queue is refused instead of run.
"""

from __future__ import annotations

import time
from typing import Any

from appliance.core.descriptor import Kind
from appliance.core.metadata import ModelMetadata
from appliance.core.status import Counter
from appliance.core.tensor import Tensor
from appliance.errors import ApplianceError, DeadlineExceeded
from appliance.model import Model
from appliance.observability.metrics import record_batch
from appliance.worker import execute, methods, refusals, traces
from appliance.worker.batcher import DERIVATIVES, STREAM, Batcher
from appliance.worker.client_gpu import ClientGpu
from appliance.worker.mappings import Mappings
from appliance.worker.own_slot import OwnSlot
from appliance.worker.pending import Pending
from appliance.worker.pieces import answered
from appliance.worker.replies import Replies
from appliance.worker.reshape import Reshapes
from appliance.worker.sequences import Sequences
from appliance.worker.stream_steps import StreamSteps
from appliance.worker.streams import Streams

# How long one loop turn may run due batches before it receives again.
RUN_TURN_S = 0.0005
# PERF: the counters' indices as plain ints, for the per-batch counting.
_SUCCESS, _BATCHES, _BATCH_ROWS = (
    int(Counter.SUCCESS),
    int(Counter.BATCHES),
    int(Counter.BATCH_ROWS),
)
_QUEUE_NS, _COMPUTE_NS = int(Counter.QUEUE_NS), int(Counter.COMPUTE_NS)


class BatchRunner:
    """Run the due batches of one model instance and answer their requests.

    Args:
        model: the loaded model.
        metadata: its declarations.
        batcher: the queue the batches come from.
        own: this instance's status slot: heartbeat, depth and counters.
        streams: the open streams, which count in the depth.
        stream_steps: what starts a stream a batch asks for.
        replies: where the answers go.
        mappings: the clients' segments this worker maps.
        sequences: the live sequences, for a sequence model.
        cuda: the clients' GPU buffers, where this worker serves them.
        reshapes: the model's declared reshapes, if any.
    """

    def __init__(
        self,
        model: Model,
        metadata: ModelMetadata,
        batcher: Batcher,
        own: OwnSlot,
        streams: Streams,
        stream_steps: StreamSteps,
        replies: Replies,
        mappings: Mappings,
        sequences: Sequences | None,
        cuda: ClientGpu | None,
        reshapes: Reshapes | None,
    ) -> None:
        self.model = model
        self.metadata = metadata
        self.batcher = batcher
        self.own = own
        self.streams = streams
        self.stream_steps = stream_steps
        self.replies = replies
        self.mappings = mappings
        self.sequences = sequences
        self.cuda = cuda
        self.reshapes = reshapes

    def run_due(self) -> None:
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

    def _run(self, batch: list[Pending]) -> None:
        now = time.monotonic()
        live = []
        for pending in batch:
            deadline = pending.message.deadline
            if deadline and now > deadline:
                waited_ms = (now - pending.arrived) * 1000
                self.replies.fail_pending(
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
        depth = len(self.batcher) + len(live) + len(self.streams)
        head = live[0]
        if head.method == STREAM:
            self.own.set_depth_now(depth)
            self.stream_steps.start(head)
        elif head.method in DERIVATIVES:
            self.own.begin_batch(depth, now)
            self._finish(head, lambda: methods.derivative(self.model, self.metadata, head))
        else:
            self.own.begin_batch(depth, now)
            self._predict(live, now)
        # The batch's outputs (views of its inputs, for a pass-through) are gone
        # now: a one-off segment's memory comes back once nothing maps it.
        self.mappings.retry()

    def _predict(self, batch: list[Pending], started: float) -> None:
        replies = self.replies
        begin = time.perf_counter_ns()
        try:
            results = self._results(batch)
        except Exception as ex:
            error = refusals.as_error(self.metadata.name, ex)
            for pending in batch:
                replies.fail_pending(pending, error)
            return
        finally:
            compute_ns = time.perf_counter_ns() - begin
            self.own.beat(time.monotonic())
        replies.last_compute_s = compute_ns / 1e9
        for pending in batch:
            if pending.trace is not None:
                ended_ns = time.time_ns()  # spans are on the wall clock
                traces.batch_ran(self.metadata.name, batch, ended_ns - compute_ns, ended_ns)
                break
        failed = 0
        for pending, outputs in zip(batch, results, strict=True):
            if isinstance(outputs, ApplianceError):
                replies.fail_pending(pending, outputs)
                failed += pending.whole is None
                continue
            if pending.whole is None:
                replies.reply(pending, Kind.REPLY, outputs)
                continue
            if pending.whole.failed:
                continue
            joined = answered(pending, outputs)
            if joined is not None:
                replies.reply(pending.whole.pending, Kind.REPLY, joined)
                self.own.count(Counter.SUCCESS)
        # The batch's replies go now, one frame per channel, before the counting.
        replies.flush()
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
        try:
            outputs = compute()
        except Exception as ex:
            self.replies.fail_pending(pending, refusals.as_error(self.metadata.name, ex))
            return
        finally:
            self.own.beat(time.monotonic())
        self.replies.reply(pending, Kind.REPLY, outputs)
        self.replies.flush()
        self._count([pending], started, time.perf_counter_ns() - begin)
