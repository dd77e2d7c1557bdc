"""Pick the least-loaded ready instance of a model.

The load of an instance is the queue depth its worker publishes in the
status table plus the requests this process has sent it and not yet seen
answered; the second term keeps a burst from one process from piling onto
an instance whose published depth has not caught up yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from appliance.core.status import SlotState, StatusTable
from appliance.errors import ModelNotFound, ModelNotReady

_READY = int(SlotState.READY)
_STARTING = int(SlotState.STARTING)
_DEAD = int(SlotState.DEAD)


@dataclass(frozen=True, slots=True)
class Target:
    """An instance chosen for a request: its slot, generation and pid."""

    slot: int
    generation: int
    pid: int


class Router:
    """Route requests by model name to instance slots.

    Args:
        status: the tree's status table.
        layout: reads the current model -> slots layout; read again whenever
            the master bumps the layout generation (a reload).
    """

    def __init__(
        self, status: StatusTable, layout: Callable[[], Mapping[str, Sequence[int]]]
    ) -> None:
        self.status = status
        self._layout = layout
        self._generation = -1
        self._slots: dict[str, tuple[int, ...]] = {}
        self._sent: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def slots(self) -> dict[str, tuple[int, ...]]:
        """The instance slots of every served model, in config order."""
        generation = self.status.layout_generation
        if generation != self._generation:
            fresh = {name: tuple(indexes) for name, indexes in self._layout().items()}
            self._slots, self._generation = fresh, generation
        return self._slots

    def pick(self, model: str) -> Target:
        """Return the least-loaded ready instance of ``model``.

        Raises:
            ModelNotFound: no such model is configured.
            ModelNotReady: no instance of it is ready now.
        """
        slots = self.slots.get(model)
        if slots is None:
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        best: Target | None = None
        best_load = 0
        hot = self.status.hot
        sent = self._sent
        for slot in slots:
            state, _role, _instance, pid, generation, depth = hot(slot)
            if state != _READY:
                continue
            load = depth + sent.get(slot, 0)
            if best is None or load < best_load:
                best, best_load = Target(slot, generation, pid), load
        if best is None:
            raise ModelNotReady(self.why_not_ready(model))
        return best

    def begin(self, slot: int) -> None:
        with self._lock:
            self._sent[slot] = self._sent.get(slot, 0) + 1

    def end(self, slot: int) -> None:
        with self._lock:
            self._sent[slot] = max(0, self._sent.get(slot, 0) - 1)

    def target_of(self, pid: int) -> Target | None:
        """The current instance whose worker has ``pid``, if any."""
        for slots in self.slots.values():
            for slot in slots:
                state, _role, _instance, slot_pid, generation, _depth = self.status.hot(slot)
                if slot_pid == pid and state in (SlotState.READY, SlotState.STOPPING):
                    return Target(slot, generation, pid)
        return None

    def coming(self, model: str, within_s: float) -> bool:
        """Whether an instance of ``model`` is starting, or restarts within ``within_s``."""
        now = time.monotonic()
        for slot in self.slots.get(model, ()):
            state = self.status.hot(slot)[0]
            if state in (_STARTING, _DEAD):
                restart_at = self.status.restart_at(slot)
                if restart_at and restart_at - now <= within_s:
                    return True
        return False

    def ready(self, model: str) -> bool:
        return any(self.status.hot(slot)[0] == _READY for slot in self.slots.get(model, ()))

    def is_current(self, target: Target) -> bool:
        """Return False once the instance died or was replaced."""
        state, _role, _instance, _pid, generation, _depth = self.status.hot(target.slot)
        return generation == target.generation and state not in (
            SlotState.DEAD,
            SlotState.FAILED,
            SlotState.EMPTY,
        )

    def why_not_ready(self, model: str) -> str:
        slots = self.slots.get(model, ())
        infos = [self.status.read(slot) for slot in slots]
        notes = sorted({info.note for info in infos if info.note})
        states = ", ".join(sorted({info.state.name.lower() for info in infos})) or "none"
        text = f"model {model} has no ready instance (0 of {len(slots)} ready; {states})"
        if notes:
            text += f": {notes[0]}"
        return text
