"""What a model worker shows of itself in the status table, written only as it changes.

Its slot holds the queue depth, the response ring's use, a heartbeat (with
the start of the batch running, for the hang watchdog), the counters the
statistics endpoints add up, and the device memory in use. Each is written
when it changes or falls due, not on every loop turn: a write is shared
memory the master and every frontend read.

Counters are added up in the process and written at once when the worker
goes idle or every COUNTERS_S, with the metrics histograms of the batches
(appliance/observability/metrics.py), so a busy worker does not write them per request,
and statistics or metrics asked right after an answer include it.
"""

from __future__ import annotations

from appliance.config import device as devices
from appliance.core.ring import Ring
from appliance.core.status import WORK_COUNTERS, Counter, StatusTable
from appliance.observability.metrics import flush_batches

HEARTBEAT_S = 0.25
COUNTERS_S = 0.1


class OwnSlot:
    """One instance's slot of the status table, as its worker loop keeps it."""

    def __init__(self, status: StatusTable, slot: int, ring: Ring, device: str) -> None:
        self.status = status
        self.slot = slot
        self._writes = status.own(slot)
        self._ring = ring
        self._device = device
        # The work counters (core.status.WORK_COUNTERS) added up since the last flush.
        self.counts = [0] * WORK_COUNTERS
        self._dirty = False
        self._counts_at = 0.0
        self._depth = -1
        self._beat_at = 0.0
        self._ring_shown = (-1, -1)

    def count(self, counter: Counter, amount: int = 1) -> None:
        self.counts[counter] += amount
        self._dirty = True

    def counted(self) -> None:
        """Say that :attr:`counts` was added to directly."""
        self._dirty = True

    def beat(self, now: float, busy_since: float = 0.0) -> None:
        """The heartbeat at ``now``; ``busy_since``: when the running batch began (0: none)."""
        self._writes.beat(now, busy_since)

    def set_depth_now(self, depth: int) -> None:
        """Write the depth at once, if it grew: a running batch counts as queued."""
        if depth > self._depth:
            self._depth = depth
            self._writes.set_depth(depth)

    def show(self, depth: int, now: float) -> None:
        """Write what changed since the last call, and the heartbeat when it is due."""
        if depth != self._depth:
            self._depth = depth
            self._writes.set_depth(depth)
        if self._dirty and (depth == 0 or now >= self._counts_at):
            self.flush_counts(now)
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
        self._writes.add_work(self.counts)
        flush_batches()
        # The work counters (core.status.WORK_COUNTERS) added up since the last flush.
        self.counts = [0] * WORK_COUNTERS
        self._dirty = False
        self._counts_at = now + COUNTERS_S

    def show_device_memory(self) -> None:
        if devices.is_cuda(self._device):
            self.status.set_device_memory(self.slot, devices.memory_in_use(self._device))
