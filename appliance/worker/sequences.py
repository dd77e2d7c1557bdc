"""Stateful sequences in a model worker: the live sequences, their admission and state.

Every step of a sequence reaches the same instance (the client's router
sees to that, see client/routing.py), so one instance holds a sequence's
whole life here: created by its start step, dropped when its end step is
accepted or after ``max_sequence_idle_s`` without a step.

Before a batch runs, the worker adds the model's control inputs (start,
end, ready, correlation id, each in its declared type: Triton's
int32/fp32/bool false-true values, the id's data type) and its state
inputs, one row per step; after, it keeps each sequence's new state from the
model's state outputs and removes those from what the client gets (unless
the model lists one among its outputs, as Triton lets a client read it).
A state whose shape may change from step to step (a -1 size) starts with
1 for each free size, and the steps of one batch all have the same state
shapes, so their rows stack.

Strategies (Triton's): "direct" gives each live sequence one of the
instance's ``max(1, max_batch_size)`` slots for its whole life and orders a
batch's rows by slot; a sequence started while every slot is held waits in
a backlog (at most ``max_candidate_sequences`` of them), its steps held by
the batcher, until an ending sequence frees a slot. "oldest" lets up to
``max_candidate_sequences`` sequences live at once and forms each batch
from the oldest waiting steps.
Either way a batch holds at most one step per sequence, so a step always
sees the state its predecessor left (sequence_batcher.py). The settings
read at load are sequence_settings.py's.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core.dtypes import DType, to_numpy
from appliance.core.sequences import (
    CORRID,
    END,
    READY,
    SEQUENCE_END,
    SEQUENCE_ID,
    SEQUENCE_START,
    START,
    Control,
    SequenceId,
    sequence_of,
)
from appliance.errors import BadRequest, ModelFailed, Overloaded
from appliance.worker.batcher import PREDICT, STREAM, Batcher
from appliance.worker.pending import Live, Pending, Step
from appliance.worker.sequence_batcher import SequenceBatcher, step_of
from appliance.worker.sequence_settings import SequenceSettings

Array = npt.NDArray[Any]


def refuse_sequence(model: str, pending: Pending) -> None:
    """Refuse sequence parameters sent to a model that is not sequence-batched.

    Raises:
        BadRequest: the request carries any of them.
    """
    if pending.sequence:
        names = ", ".join(sorted(pending.sequence))
        raise BadRequest(
            f"model {model} does not serve stateful sequences (sequence_batching is off), but "
            f"the request carries {names}: send it without them, or turn on "
            f"models[{model}].sequence_batching"
        )


def batcher_for(
    max_batch_size: int,
    max_queue_delay_s: float,
    sequences: Sequences | None,
    preferred: tuple[int, ...] = (),
) -> Batcher:
    """The batcher of an instance: one step per sequence in a batch where sequences are on."""
    if sequences is None:
        return Batcher(max_batch_size, max_queue_delay_s, preferred)
    direct = sequences.settings.strategy == "direct"
    shaped = not all(item.fixed for item in sequences.settings.states)
    batcher = SequenceBatcher(max_batch_size, max_queue_delay_s, direct, shaped)
    sequences.batcher = batcher
    return batcher


class Sequences:
    """The live sequences of one instance."""

    def __init__(self, settings: SequenceSettings) -> None:
        self.settings = settings
        self.live: dict[SequenceId, Live] = {}
        self.slots = max(1, settings.max_batch_size) if settings.strategy == "direct" else 0
        # A heap: a new sequence takes the lowest free slot.
        self._free = list(range(self.slots))
        self.waiting: deque[Live] = deque()
        # Set by batcher_for: it holds the steps of waiting sequences.
        self.batcher: SequenceBatcher | None = None

    # -- admission ------------------------------------------------------------

    def admit(self, pending: Pending, now: float) -> None:
        """Attach ``pending`` to its sequence, starting or ending it.

        Raises:
            BadRequest: no or bad sequence id, an unknown id without a start,
                a second start of a live id, or a step of more than one row.
            Overloaded: a start finds every sequence place of the instance
                taken ("direct": every slot and the whole backlog).
        """
        name = self.settings.model
        if pending.method not in (PREDICT, STREAM):
            raise BadRequest(
                f"model {name} serves stateful sequences by prediction and streams only, "
                f"not by {pending.method}"
            )
        if pending.method == STREAM and self.settings.states:
            raise BadRequest(
                f"model {name} keeps an implicit state, which a streamed step cannot carry "
                "back: send its steps as predictions"
            )
        params = pending.sequence or {}
        sequence = sequence_of(params)
        if sequence is None:
            raise BadRequest(
                f"model {name} serves stateful sequences: every request needs a sequence_id "
                f"parameter (a non-zero integer or a non-empty string), "
                f"got {params.get(SEQUENCE_ID)!r}"
            )
        start = _flag(name, params, SEQUENCE_START)
        end = _flag(name, params, SEQUENCE_END)
        if self.settings.max_batch_size > 0 and pending.rows != 1:
            raise BadRequest(
                f"model {name}: a step of sequence {sequence!r} must hold 1 row (batch size 1), "
                f"got {pending.rows}"
            )
        live = self.live.get(sequence)
        if start:
            self._check_id(sequence)
            if live is not None:
                raise BadRequest(
                    f"model {name}: sequence {sequence!r} is already live (started, not yet "
                    "ended); end it with sequence_end first, or start another sequence_id"
                )
            live = self._create(sequence, now)
        elif live is None:
            raise BadRequest(
                f"model {name} has no live sequence {sequence!r} on this instance: start it with "
                f"sequence_start=true (a sequence is dropped after its sequence_end step, after "
                f"{self.settings.idle_s:g} s without a step (models[{name}].max_sequence_idle_s), "
                "or when its instance restarts)"
            )
        live.last = now
        if end:
            self._drop(live)
        pending.step = Step(live, start, end)

    def _check_id(self, sequence: SequenceId) -> None:
        """Refuse a sequence id the model's correlation id control cannot hold.

        Raises:
            BadRequest: a string id for an integer control, or an integer
                out of its type's range.
        """
        for name, declared in self.settings.control_inputs().items():
            dtype = declared.dtype
            if declared.kind != CORRID or dtype is None or dtype is DType.BYTES:
                continue
            if isinstance(sequence, str):
                raise BadRequest(
                    f"model {self.settings.model}: its correlation id input {name} is "
                    f"{dtype.value}: send an integer sequence_id, not {sequence!r}"
                )
            limits = np.iinfo(_numpy(dtype))
            if not limits.min <= sequence <= limits.max:
                raise BadRequest(
                    f"model {self.settings.model}: sequence_id {sequence} does not fit its "
                    f"correlation id input {name} ({dtype.value}: {limits.min} to {limits.max})"
                )

    def _create(self, sequence: SequenceId, now: float) -> Live:
        settings = self.settings
        waiting = False
        if self.slots:
            if self._free:
                slot = heapq.heappop(self._free)
            elif len(self.waiting) < settings.max_candidates:
                slot, waiting = -1, True
            else:
                raise Overloaded(
                    f"model {settings.model}: too many live sequences: all {self.slots} sequence "
                    f"slots of its instance are held (strategy direct: max(1, max_batch_size) per "
                    f"instance) and {len(self.waiting)} sequences already wait for one (the "
                    f"limit, models[{settings.model}].max_candidate_sequences); end sequences or "
                    "add instances"
                )
        else:
            if len(self.live) >= settings.max_candidates:
                raise Overloaded(
                    f"model {settings.model}: too many live sequences: its instance holds "
                    f"{len(self.live)}, the limit (models[{settings.model}]."
                    f"max_candidate_sequences) is {settings.max_candidates}; end sequences, "
                    "add instances, or raise the limit"
                )
            slot = -1
        states = {
            item.input: np.full(item.first_shape, item.initial, dtype=_numpy(item.dtype))
            for item in settings.states
        }
        live = Live(sequence, slot, states, now, waiting)
        self.live[sequence] = live
        if waiting:
            self.waiting.append(live)
        return live

    def _drop(self, live: Live) -> None:
        if self.live.get(live.id) is live:
            del self.live[live.id]
        if live.waiting:
            # Its steps still run once it has a slot, which it then gives back.
            live.ended = True
        elif live.slot >= 0:
            heapq.heappush(self._free, live.slot)
            self._promote()

    def _promote(self) -> None:
        """Give free slots to the sequences waiting longest; their held steps may run."""
        while self._free and self.waiting:
            live = self.waiting.popleft()
            live.slot, live.waiting = heapq.heappop(self._free), False
            if self.batcher is not None:
                self.batcher.release(live)
            if live.ended:
                # Its end step is queued now: the slot goes on to the next in line.
                heapq.heappush(self._free, live.slot)

    def expire(self, now: float) -> list[SequenceId]:
        """Drop the sequences idle longer than ``max_sequence_idle_s``; return their ids.

        A sequence waiting for a slot is not idle: it waits on this instance.
        """
        limit = now - self.settings.idle_s
        idle = [live for live in self.live.values() if live.last < limit and not live.waiting]
        for live in idle:
            self._drop(live)
        return [live.id for live in idle]

    # -- running steps --------------------------------------------------------

    def inputs(self, batch: list[Pending], inputs: dict[str, Array]) -> dict[str, Array]:
        """The batch's inputs with its control and state inputs added."""
        steps = [step_of(pending) for pending in batch]
        batched = self.settings.max_batch_size > 0
        full = dict(inputs)
        for name, declared in self.settings.control_inputs().items():
            full[name] = _control(declared, steps, batched)
        for item in self.settings.states:
            values = [step.live.state[item.input] for step in steps]
            full[item.input] = np.stack(values) if batched else values[0]
        return full

    def keep(self, batch: list[Pending], produced: Mapping[str, Any]) -> dict[str, Any]:
        """Keep each sequence's new state; return the outputs without the state ones.

        Raises:
            ModelFailed: a state output is missing or has the wrong shape.
        """
        outputs = dict(produced)
        batched = self.settings.max_batch_size > 0
        name = self.settings.model
        for item in self.settings.states:
            if item.output not in outputs:
                raise ModelFailed(f"model {name} did not return its state output {item.output}")
            if item.output in self.settings.exposed:
                value = np.asarray(outputs[item.output], dtype=_numpy(item.dtype))
            else:
                value = np.asarray(outputs.pop(item.output), dtype=_numpy(item.dtype))
            want = (len(batch), *item.shape) if batched else item.shape
            fits = len(value.shape) == len(want) and all(
                size in (-1, got) for size, got in zip(want, value.shape, strict=True)
            )
            if not fits:
                raise ModelFailed(
                    f"model {name} state output {item.output} has shape {list(value.shape)}, "
                    f"expected {list(want)}"
                )
            for index, pending in enumerate(batch):
                step_of(pending).live.state[item.input] = (
                    value[index].copy() if batched else value.copy()
                )
        return outputs


def _flag(model: str, params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"model {model}: parameter {key} must be true or false, got {value!r}")
    return value


def _control(declared: Control, steps: list[Step], batched: bool) -> Array:
    """One control input: a row per step, in the control's type (Triton's [1] or [batch, 1])."""
    if declared.kind == CORRID:
        ids = [step.live.id for step in steps]
        dtype = declared.dtype
        if dtype is None:
            dtype = DType.INT64 if all(isinstance(value, int) for value in ids) else DType.BYTES
        if dtype is DType.BYTES:
            array: Array = np.array([str(value).encode() for value in ids], dtype=object)
        else:
            # Admission refused ids this type cannot hold (Sequences._check_id).
            array = np.array(ids, dtype=to_numpy(dtype))
    else:
        flags = {
            START: [step.start for step in steps],
            END: [step.end for step in steps],
            READY: [True for _ in steps],
        }[declared.kind]
        values = [declared.true if flag else declared.false for flag in flags]
        array = np.array(values, dtype=to_numpy(declared.dtype or DType.INT32))
    return array.reshape(-1, 1) if batched else array.reshape(1)


def _numpy(dtype: DType) -> Any:
    return object if dtype is DType.BYTES else to_numpy(dtype)
