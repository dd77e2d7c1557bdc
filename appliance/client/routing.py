"""Pick the least-loaded ready instance of a model, or a sequence's own instance.

The load of an instance is the queue depth its worker publishes in the
status table plus the requests this process has sent it and not yet seen
answered; the second term keeps a burst from one process from piling onto
an instance whose published depth has not caught up yet. Among equally
loaded instances the first choice rotates, so that at light load every
instance serves (and has its sockets to every frontend), not only the first.

A request that carries a ``sequence_id`` (see appliance/core/sequences.py)
goes where the sequence lives instead: the instance its id hashes to among
the model's ready instances, so every frontend process agrees without
talking to the others. Each process also remembers the instance it sent a
sequence to, which keeps a sequence where it started when the ready set
changes, and tells a step whose instance has since stopped that its state
is gone.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from appliance.core.sequences import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_START, sequence_of
from appliance.core.status import SlotState, StatusTable
from appliance.errors import ModelNotFound, ModelNotReady, WorkerLost

_READY = int(SlotState.READY)
_STARTING = int(SlotState.STARTING)
_DEAD = int(SlotState.DEAD)
# Sequences this process remembers the instance of; the oldest are forgotten first.
MAX_REMEMBERED_SEQUENCES = 65536


class Target(NamedTuple):
    """An instance chosen for a request: its slot, generation and pid.

    ``sequence`` names the stateful sequence the request belongs to, so that
    losing the instance can tell the client which sequence's state went with it.

    PERF: a tuple, made for every request; a frozen dataclass sets each field
    through object.__setattr__.
    """

    slot: int
    generation: int
    pid: int
    sequence: str | None = None


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
        self._turn = 0
        self._sequences: OrderedDict[tuple[str, int | str], Target] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def slots(self) -> dict[str, tuple[int, ...]]:
        """The instance slots of every served model, in config order."""
        self.follow()
        return self._slots

    def follow(self) -> None:
        """Read the layout again if the master published a new one (a reload or a load)."""
        generation = self.status.layout_generation
        if generation != self._generation:
            fresh = {name: tuple(indexes) for name, indexes in self._layout().items()}
            self._slots, self._generation = fresh, generation

    def pick(self, model: str, parameters: Mapping[str, Any] | None = None) -> Target:
        """Return the least-loaded ready instance of ``model``, or its sequence's.

        Raises:
            ModelNotFound: no such model is configured.
            ModelNotReady: no instance of it is ready now.
            WorkerLost: the instance of the request's sequence has stopped.
        """
        slots = self.slots.get(model)
        if slots is None:
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        if parameters and SEQUENCE_ID in parameters:
            sequence = sequence_of(parameters)
            # A bad id goes anywhere: the worker refuses it with the reason.
            if sequence is not None:
                return self._pick_sequence(model, slots, sequence, parameters)
        best: Target | None = None
        best_load = 0
        hot = self.status.hot
        sent = self._sent
        if len(slots) > 1:
            # Ties rotate: at light load every instance serves, not only the first.
            turn = self._turn = (self._turn + 1) % len(slots)
            slots = slots[turn:] + slots[:turn]
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

    def _pick_sequence(
        self,
        model: str,
        slots: Sequence[int],
        sequence: int | str,
        parameters: Mapping[str, Any],
    ) -> Target:
        key = (model, sequence)
        start = parameters.get(SEQUENCE_START) is True
        with self._lock:
            known = self._sequences.get(key)
        if known is not None and not start:
            if not self.is_current(known):
                raise lost_sequence(known)
            target = known
        else:
            chosen = self._hashed(model, slots, sequence)
            target = chosen._replace(sequence=f"sequence {sequence!r} of model {model}")
        with self._lock:
            if parameters.get(SEQUENCE_END) is True:
                self._sequences.pop(key, None)
            else:
                self._sequences[key] = target
                self._sequences.move_to_end(key)
                if len(self._sequences) > MAX_REMEMBERED_SEQUENCES:
                    self._sequences.popitem(last=False)
        return target

    def _hashed(self, model: str, slots: Sequence[int], sequence: int | str) -> Target:
        """The first ready instance at or after the one ``sequence`` hashes to."""
        # A stable hash (not hash()): every process must pick the same instance.
        first = zlib.crc32(repr(sequence).encode())
        hot = self.status.hot
        for offset in range(len(slots)):
            slot = slots[(first + offset) % len(slots)]
            state, _role, _instance, pid, generation, _depth = hot(slot)
            if state == _READY:
                return Target(slot, generation, pid)
        raise ModelNotReady(self.why_not_ready(model))

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


def lost_sequence(target: Target) -> WorkerLost:
    """The error for a step of a sequence whose instance stopped: its state is gone."""
    return WorkerLost(
        f"{target.sequence} lived on its instance pid {target.pid}, which has stopped; "
        "the sequence's state is gone: start it again with sequence_start=true"
    )
