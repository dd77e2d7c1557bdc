"""The model worker's serving loop: one thread, one PULL socket in, one model.

Each turn of the loop:

1. receive every message waiting on the socket (requests, releases, cancels;
   intake.py);
2. run the next due batch and reply to each of its requests, with outputs
   written once into this worker's response ring (batch_runner.py,
   replies.py);
3. advance each running stream by one part (stream_steps.py), but those
   paused because their readers fell behind;
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

import zmq

from appliance.config.scheduling import Scheduling
from appliance.core.ring import Ring
from appliance.core.status import SlotState, StatusTable
from appliance.errors import BadRequest
from appliance.processes.lifetime import pid_alive
from appliance.worker.batch_runner import BatchRunner
from appliance.worker.client_gpu import ClientGpu
from appliance.worker.cuda_regions import CudaRegions
from appliance.worker.intake import Intake
from appliance.worker.loader import Loaded
from appliance.worker.mappings import Mappings
from appliance.worker.outbox import Outbox
from appliance.worker.own_slot import HEARTBEAT_S, OwnSlot
from appliance.worker.plain import PlainRequests
from appliance.worker.queueing import Queueing
from appliance.worker.replies import Replies
from appliance.worker.reshape import Reshapes
from appliance.worker.sequence_settings import SequenceSettings
from appliance.worker.sequences import Sequences, batcher_for
from appliance.worker.stream_steps import StreamSteps
from appliance.worker.streams import Streams

log = logging.getLogger("appliance.worker")

# A stopping worker still serves requests routed to it just before its slot
# was marked STOPPING; it exits once it has been idle this long.
LINGER_S = 0.2
HOUSEKEEPING_S = 1.0


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
        self.pid = os.getpid()
        self.own = OwnSlot(status, slot, ring, self.model.device)
        self._housekeeping_at = time.monotonic() + HOUSEKEEPING_S
        self.replies = Replies(
            self.outbox,
            ring,
            inline_threshold,
            self.own,
            self.batcher,
            self.mappings,
            self.cuda,
            self.pid,
        )
        self.stream_steps = StreamSteps(self.streams, self.replies, self.own, self.metadata)
        self.runner = BatchRunner(
            self.model,
            self.metadata,
            self.batcher,
            self.own,
            self.streams,
            self.stream_steps,
            self.replies,
            self.mappings,
            self.sequences,
            self.cuda,
            reshapes,
        )
        self.intake = Intake(
            socket,
            self.model,
            self.metadata,
            self.batcher,
            max_queue,
            self.plain,
            self.queueing,
            self.mappings,
            self.cuda,
            self.sequences,
            passthrough,
            self.outbox,
            self.replies,
            self.stream_steps,
            self.pid,
        )

    # -- the loop -------------------------------------------------------------

    def serve(self) -> None:
        """Run until :meth:`stop` is called and all accepted work is done."""
        self.status.set_state(self.slot, SlotState.READY, self.pid)
        batcher, queueing, streams = self.batcher, self.queueing, self.streams
        # PERF: the collaborators' methods bound once, not looked up every turn.
        receive, expire = self.intake.receive, self.intake.expire
        run_due, step_streams = self.runner.run_due, self.stream_steps.step
        flush_replies = self.replies.flush
        own = self.own
        while not self._finished():
            wait = 0.0 if streams.running else batcher.wait_s(time.monotonic())
            if wait is None or wait >= 0.001:
                # Nothing due: wait in a receive for a message, or for the batch
                # (or, idle, until the histograms are to be written: own_slot.py).
                receive(own.wait_ms() if wait is None else int(min(wait, HEARTBEAT_S) * 1000))
            else:
                if wait > 0:
                    # PERF: ZeroMQ's waits count whole milliseconds, and polling
                    # out the rest of a batch's wait spun up to 1 ms of CPU per
                    # batch. What arrives meanwhile joins the batch all the same.
                    time.sleep(wait)
                receive(0)
            if queueing is not None and queueing.timed:
                expire(time.monotonic())
            run_due()
            step_streams()
            # The turn's other replies (refusals, stream parts): one frame per channel.
            flush_replies()
            self._tick()

    def stop(self) -> None:
        """Finish what was routed here; the loop ends once idle for LINGER_S."""
        self.stopping = True
        self.intake.last_message = time.monotonic()
        self.status.set_state(self.slot, SlotState.STOPPING)

    def _finished(self) -> bool:
        if not self.stopping or self.batcher or self.streams:
            return False
        return time.monotonic() - self.intake.last_message >= LINGER_S

    def _tick(self) -> None:
        now = time.monotonic()
        self.own.show(len(self.batcher) + len(self.streams), now, self.intake.last_message)
        if now >= self._housekeeping_at:
            self._housekeeping_at = now + HOUSEKEEPING_S
            self._drop_dead_clients()
            self.own.show_device_memory()
            if self.cuda is not None:
                self.cuda.regions.sweep()
            if self.sequences is not None:
                for sequence in self.sequences.expire(now):
                    log.info("dropped sequence %r: idle past max_sequence_idle_s", sequence)

    def close(self) -> None:
        """Close every reply socket, flushing what it holds, and unmap segments;
        the last counters are written first."""
        self.own.flush_counts(time.monotonic())
        self.outbox.close()
        self.mappings.close()
        if self.cuda is not None:
            self.cuda.regions.close()

    # -- clients that died ----------------------------------------------------

    def _drop_dead_clients(self) -> None:
        self.mappings.retry()
        owners = self.outbox.owners() | self.mappings.owners()
        for pid in owners:
            if pid_alive(pid):
                continue
            self.outbox.drop_client(pid)
            for stream in [s for s in self.streams if s.pending.message.pid == pid]:
                self.stream_steps.end(stream, BadRequest("client went away"))
            self.batcher.drop(lambda p, dead=pid: p.message.pid == dead)
            self.mappings.drop_owner(pid)
