"""What a model worker shows of itself in the status table, written only as it changes.

Its slot holds the queue depth, the response ring's use, a heartbeat (with
the start of the batch running, for the hang watchdog), the counters the
statistics endpoints add up, and the device memory in use. Each is written
when it changes or falls due, not on every loop turn: a write is shared
memory the master and every frontend read.

Counters are added up in the process and written at once when the worker
goes idle or every COUNTERS_S, so a busy worker does not write them per
request, and statistics asked right after an answer include it. The
process keeps their running totals (read from the slot when it starts, a
restarted instance's slot keeps its predecessor's), so that what a loop
turn writes (depth, an idle heartbeat, the counters) is one write, as a
batch's start (depth, heartbeat, busy-since) is. The metrics
histograms of the batches (appliance/observability/metrics.py) are written
every COUNTERS_S too, and when the worker goes idle; but while requests come
less than IDLE_FLUSH_S apart, only once it has been idle that long. A scrape a
few milliseconds after an answer includes it.

PERF: written each time the worker went idle, the three histograms cost an
identity worker 10-13 us of its main thread a request at one client (2-6 at
eight), where requests come a fraction of a millisecond apart and each
leaves the worker idle. Where they come further apart than IDLE_FLUSH_S, waiting
would cost a wake-up a request instead (docs/performance.md, "What the
bookkeeping costs").
"""

from __future__ import annotations

import time

from appliance.config import device as devices
from appliance.core.ring import Ring
from appliance.core.status import Counter, StatusTable
from appliance.observability.metrics import flush_batches

HEARTBEAT_S = 0.25
COUNTERS_S = 0.1
IDLE_FLUSH_S = 0.005
HEARTBEAT_MS = int(HEARTBEAT_S * 1000)
IDLE_FLUSH_MS = int(IDLE_FLUSH_S * 1000)
# PERF: the counters' indices as plain ints.
_SUCCESS, _FAIL, _LAST_MS = int(Counter.SUCCESS), int(Counter.FAIL), int(Counter.LAST_INFERENCE_MS)


class OwnSlot:
    """One instance's slot of the status table, as its worker loop keeps it."""

    def __init__(self, status: StatusTable, slot: int, ring: Ring, device: str) -> None:
        self.status = status
        self.slot = slot
        self._writes = status.own(slot)
        self._ring = ring
        self._device = device
        # The work counters' running totals (SUCCESS .. LAST_INFERENCE_MS): added
        # to as requests are answered, written whole.
        self.counts = self._writes.work()
        self._answered = self.counts[_SUCCESS] + self.counts[_FAIL]
        self._dirty = False
        self._counts_at = 0.0
        # Batches recorded in the histograms since they were last written.
        self._batches = False
        self._batches_at = 0.0
        # When the last message came, and whether it came within IDLE_FLUSH_S
        # of the one before (requests keep coming: the histograms may wait).
        self._last_message = 0.0
        self._coming = False
        self._depth = -1
        self._beat_at = 0.0
        self._ring_shown = (-1, -1)

    def count(self, counter: Counter, amount: int = 1) -> None:
        self.counts[counter] += amount
        self._dirty = True

    def counted(self) -> None:
        """Say that :attr:`counts` was added to directly, and a batch recorded
        in the histograms (metrics.record_batch)."""
        self._dirty = True
        self._batches = True

    def wait_ms(self) -> int:
        """How long an idle worker may wait for a message before it shows again:
        IDLE_FLUSH_MS while batches wait to be written, else HEARTBEAT_MS."""
        return IDLE_FLUSH_MS if self._batches else HEARTBEAT_MS

    def beat(self, now: float, busy_since: float = 0.0) -> None:
        """The heartbeat at ``now``; ``busy_since``: when the running batch began (0: none)."""
        self._writes.beat(now, busy_since)

    def set_depth_now(self, depth: int) -> None:
        """Write the depth at once, if it grew: a running batch counts as queued."""
        if depth > self._depth:
            self._depth = depth
            self._writes.set_depth(depth)

    def begin_batch(self, depth: int, now: float) -> None:
        """A batch starts at ``now``: the depth with it counted (if it grew: it comes
        down once the turn is over), and busy-since for the hang watchdog."""
        if depth < self._depth:
            depth = self._depth
        self._depth = depth
        self._writes.begin_batch(depth, now)

    def show(self, depth: int, now: float, idle_since: float) -> None:
        """Write what changed since the last call, and the heartbeat when it is due;
        ``idle_since``: when the last message came."""
        if self._dirty and (depth == 0 or now >= self._counts_at):
            self._depth = depth
            self._write_counts(now)
        elif depth != self._depth:
            self._depth = depth
            self._writes.set_depth(depth)
        if idle_since != self._last_message:
            self._coming = idle_since - self._last_message < IDLE_FLUSH_S
            self._last_message = idle_since
        if self._batches and (
            now >= self._batches_at
            or (depth == 0 and (not self._coming or now - idle_since >= IDLE_FLUSH_S))
        ):
            self._write_batches(now)
        ring = self._ring
        # Space comes back with clients' releases too, not only with replies.
        in_use = (ring.used_bytes, ring.spilled_bytes)
        if in_use != self._ring_shown:
            self._ring_shown = in_use
            self.status.set_ring(self.slot, ring.used_bytes, ring.capacity, ring.spilled_bytes)
        if now >= self._beat_at:
            self._writes.beat(now)
            self._beat_at = now + HEARTBEAT_S

    def flush_counts(self, now: float) -> None:
        """Write the counters and the histograms now, whatever is due."""
        self._write_counts(now)
        self._write_batches(now)

    def _write_counts(self, now: float) -> None:
        """The depth, an idle heartbeat and the counters: called between batches."""
        counts = self.counts
        answered = counts[_SUCCESS] + counts[_FAIL]
        if answered != self._answered:
            self._answered = answered
            counts[_LAST_MS] = int(time.time() * 1000)
        self._writes.write(self._depth, now, counts)
        self._dirty = False
        self._counts_at = now + COUNTERS_S
        self._beat_at = now + HEARTBEAT_S

    def _write_batches(self, now: float) -> None:
        flush_batches()
        self._batches = False
        self._batches_at = now + COUNTERS_S

    def show_device_memory(self) -> None:
        if devices.is_cuda(self._device):
            self.status.set_device_memory(self.slot, devices.memory_in_use(self._device))
