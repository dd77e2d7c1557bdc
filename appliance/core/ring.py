"""A single-owner allocator for tensor data in shared memory.

DESIGN.md calls each process's tensor segment its *ring*. Allocation here is
first-fit over a sorted free list with coalescing rather than a strict ring,
so a request that is slow to be released never blocks the space behind it.
The bookkeeping lives in the owner's private memory: no locks in shared
memory, and a dead reader can never corrupt it.

A tensor that does not fit is placed in a one-off segment of its own (up to
``max_tensor_bytes``), so the ring is never corrupted or blocked by it. Spill
segments pay first-touch page faults, so their total is capped; beyond the
cap the allocation fails with :class:`~appliance.errors.Overloaded`.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count

from appliance.core.segment import Segment, mib
from appliance.errors import Overloaded, ShmExhausted, TooLarge

log = logging.getLogger("appliance.shm")

ALIGN = 64
REGROW_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Block:
    """An allocation: where it lives and how many bytes were asked for."""

    segment: str
    offset: int
    nbytes: int


def ring_segment(name: str, size: tuple[int, int], what: str) -> Segment:
    """A ring's segment: ``size`` (wanted, floor) bytes, or less where /dev/shm is short.

    A ring smaller than wanted is logged once, with ``what`` it holds.

    Raises:
        ShmExhausted: not even the floor fits.
    """
    wanted, floor = size
    segment = Segment.create_shrinking(name, wanted, floor)
    if segment.size < wanted:
        log.warning(
            "%s ring of %s, not %s: /dev/shm has no room for more; larger %s spill into "
            "one-off segments while it has room for them",
            what,
            mib(segment.size),
            mib(wanted),
            "requests" if what == "request" else "replies",
        )
    return segment


def is_spill(segment_name: str) -> bool:
    """Return True for a one-off segment (its name ends in ``-x<n>``)."""
    last = segment_name.rsplit("-", 1)[-1]
    return len(last) > 1 and last[0] == "x" and last[1:].isdigit()


def _aligned(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


class Ring:
    """Allocate and release blocks in one owned segment, spilling if needed.

    Args:
        segment: the owned segment to allocate in; None while /dev/shm had no
            room for one: every block spills (and fails while no room
            returns), and ``regrow`` is tried now and then.
        spill_prefix: name prefix for one-off segments (``<prefix>-x<n>``).
        max_tensor_bytes: the largest single allocation allowed at all.
        spill_limit_bytes: the most bytes held in one-off segments at once.
        limit_hint: the config key to name in errors about the ring's size.
        regrow: makes the ring's segment once there is room again.
    """

    def __init__(
        self,
        segment: Segment | None,
        spill_prefix: str,
        max_tensor_bytes: int,
        spill_limit_bytes: int,
        limit_hint: str = "shm ring size",
        regrow: Callable[[], Segment] | None = None,
    ) -> None:
        self.segment: Segment | None = None
        self._name = ""
        self.capacity = 0
        self._free: list[tuple[int, int]] = []
        self._used: dict[int, int] = {}
        self.used_bytes = 0
        self._spills: dict[str, Segment] = {}
        self._spilled_bytes = 0
        self._spill_prefix = spill_prefix
        self._spill_names = count()
        self._max_tensor = max_tensor_bytes
        self._spill_limit = spill_limit_bytes
        self._hint = limit_hint
        self._regrow = regrow
        self._regrow_at = 0.0
        if segment is not None:
            self._adopt(segment)

    def _adopt(self, segment: Segment) -> None:
        self.segment = segment
        self._name = segment.name
        self.capacity = segment.size
        self._free = [(0, segment.size)]

    def _try_regrow(self) -> None:
        """Make the ring's segment if there is room again (at most once a second)."""
        now = time.monotonic()
        if self._regrow is None or now < self._regrow_at:
            return
        self._regrow_at = now + REGROW_EVERY_S
        try:
            segment = self._regrow()
        except ShmExhausted:
            return
        log.info("shared memory has room again: a ring of %d KiB", segment.size >> 10)
        self._adopt(segment)

    @property
    def spilled_bytes(self) -> int:
        return self._spilled_bytes

    def alloc(self, nbytes: int) -> Block:
        """Reserve ``nbytes``; return where they are.

        Raises:
            TooLarge: ``nbytes`` exceeds ``max_tensor_bytes``.
            Overloaded: the ring is full and the spill cap is reached.
        """
        if nbytes > self._max_tensor:
            raise TooLarge(
                f"a tensor of {nbytes} bytes exceeds the limit of {self._max_tensor} bytes "
                "(shm.max_tensor_bytes)"
            )
        size = _aligned(nbytes)
        if self.segment is None:
            self._try_regrow()
        for index, (start, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[index]
                else:
                    self._free[index] = (start + size, length - size)
                self._used[start] = size
                self.used_bytes += size
                return Block(self._name, start, nbytes)
        return self._spill(nbytes)

    def _spill(self, nbytes: int) -> Block:
        if self._spilled_bytes + nbytes > self._spill_limit:
            name = self._name or self._spill_prefix
            raise Overloaded(
                f"shared-memory ring {name} is full ({self.used_bytes} of "
                f"{self.capacity} bytes in use, {self._spilled_bytes} spilled); raise "
                f"{self._hint} or send fewer requests at once"
            )
        name = f"{self._spill_prefix}-x{next(self._spill_names)}"
        # PERF: a one-off segment is written once; prefaulting would touch it twice.
        self._spills[name] = Segment.create(name, max(nbytes, 1), prefault=False)
        self._spilled_bytes += nbytes
        return Block(name, 0, nbytes)

    def view(self, block: Block) -> memoryview:
        """Return a writable view of a block's bytes."""
        if self.segment is not None and block.segment == self._name:
            segment = self.segment
        else:
            segment = self._spills[block.segment]
        return memoryview(segment.buffer)[block.offset : block.offset + block.nbytes]

    def release(self, block: Block) -> None:
        """Give a block back; unknown or already released blocks are ignored."""
        if block.segment != self._name:
            spill = self._spills.pop(block.segment, None)
            if spill is not None:
                self._spilled_bytes -= block.nbytes
                spill.close()
                spill.unlink()
            return
        size = self._used.pop(block.offset, None)
        if size is None:
            return
        self.used_bytes -= size
        self._insert_free(block.offset, size)

    def _insert_free(self, start: int, size: int) -> None:
        free = self._free
        index = bisect.bisect_left(free, (start, 0))
        # Merge with the following extent, then with the preceding one.
        if index < len(free) and free[index][0] == start + size:
            size += free[index][1]
            del free[index]
        if index > 0 and free[index - 1][0] + free[index - 1][1] == start:
            prev_start, prev_size = free[index - 1]
            free[index - 1] = (prev_start, prev_size + size)
        else:
            free.insert(index, (start, size))

    def close(self) -> None:
        """Unlink the ring and every spill segment (owner only)."""
        for spill in self._spills.values():
            spill.close()
            spill.unlink()
        self._spills.clear()
        if self.segment is not None:
            self.segment.unlink()
            self.segment.close()
