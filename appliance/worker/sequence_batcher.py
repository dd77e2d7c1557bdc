"""The batcher of a sequence model: at most one step of each sequence in a batch.

So a step always sees the state its predecessor left. The steps of a
sequence waiting for a slot ("direct") are held apart until it has one;
under "direct" a batch's rows are ordered by slot, and steps whose states
have free sizes batch only with steps of the same state shapes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from appliance.worker.batcher import Batcher
from appliance.worker.pending import Live, Pending, Step


class SequenceBatcher(Batcher):
    """A batcher that puts at most one step of each sequence in a batch.

    The steps of a sequence waiting for a slot are held apart, in arrival
    order, until :meth:`release`; they count as queued all the same (the
    instance's depth, ``max_queue``, a drain), and a cancel finds them.
    """

    def __init__(
        self, max_batch_size: int, max_queue_delay_s: float, direct: bool, shaped: bool = False
    ) -> None:
        super().__init__(max_batch_size, max_queue_delay_s)
        self.direct = direct
        # A state of free sizes: only steps whose states have equal shapes stack.
        self.shaped = shaped
        self.held: deque[Pending] = deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.held)

    def add(self, pending: Pending) -> None:
        (self.held if step_of(pending).live.waiting else self.queue).append(pending)

    def release(self, live: Live) -> None:
        """Queue the held steps of ``live``, which has a slot now."""
        still = deque[Pending]()
        for item in self.held:
            (self.queue if step_of(item).live is live else still).append(item)
        self.held = still

    def drop(self, predicate: Any) -> list[Pending]:
        dropped = super().drop(predicate)
        held = [item for item in self.held if predicate(item)]
        if held:
            self.held = deque([item for item in self.held if not predicate(item)])
        return dropped + held

    def _admitter(self, head: Pending, now: float) -> Callable[[Pending], bool]:
        # A sequence's later steps wait behind its first one left in the queue.
        seen = {id(step_of(head).live)}
        size = 1
        shapes = _state_shapes(head) if self.shaped else None

        def admit(item: Pending) -> bool:
            nonlocal size
            live = id(step_of(item).live)
            joins = item.key == head.key and live not in seen and size < self.max_batch_size
            joins = joins and (shapes is None or _state_shapes(item) == shapes)
            seen.add(live)
            size += joins
            return joins

        return admit

    def _ordered(self, batch: list[Pending]) -> list[Pending]:
        if self.direct:
            batch.sort(key=lambda pending: step_of(pending).live.slot)
        return batch


def step_of(pending: Pending) -> Step:
    """The step of its sequence a sequence model's request is."""
    step = pending.step
    assert step is not None, "a sequence model's requests are admitted before they queue"
    return step


def _state_shapes(pending: Pending) -> tuple[tuple[int, ...], ...]:
    return tuple(value.shape for value in step_of(pending).live.state.values())
