"""Stateful sequences in a model worker: admission, implicit state, batches of steps.

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
sees the state its predecessor left.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.config.settings import ModelConfig
from appliance.core.dtypes import DType, to_numpy
from appliance.core.sequences import (
    CONTROLS,
    CORRID,
    END,
    READY,
    SEQUENCE_END,
    SEQUENCE_ID,
    SEQUENCE_START,
    START,
    Control,
    SequenceId,
    State,
    control,
    sequence_of,
)
from appliance.errors import BadRequest, ModelFailed, Overloaded
from appliance.model import Model
from appliance.worker.batcher import PREDICT, STREAM, Batcher
from appliance.worker.pending import Live, Pending, Step

Array = npt.NDArray[Any]


@dataclass(slots=True)
class SequenceSettings:
    """A sequence model's settings, from its class and its [[models]] entry."""

    model: str
    strategy: str
    idle_s: float
    max_candidates: int
    max_batch_size: int
    states: Sequence[State] = ()
    # A kind alone ("start", ...) stands for that kind's default control.
    controls: Mapping[str, Control | str] = field(default_factory=dict)
    max_queue_delay_ms: float = 0.0
    # State outputs the model lists among its outputs: the client gets them too.
    exposed: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.controls = {
            name: declared if isinstance(declared, Control) else control(declared)
            for name, declared in self.controls.items()
        }

    def control_inputs(self) -> Mapping[str, Control]:
        """The controls, each a :class:`Control` (see ``__post_init__``)."""
        return {name: c for name, c in self.controls.items() if isinstance(c, Control)}

    def describe(self) -> dict[str, Any]:
        """These settings as Triton's ModelSequenceBatching (for its model-config JSON).

        SPEC: Triton's model_config.proto. A correlation id control of no
        declared type (a Python model's) reads TYPE_INT64; a string id
        arrives as BYTES.
        """
        delay = {"max_queue_delay_microseconds": int(self.max_queue_delay_ms * 1000)}
        strategy = (
            {"direct": delay}
            if self.strategy == "direct"
            else {"oldest": {"max_candidate_sequences": self.max_candidates, **delay}}
        )
        controls = []
        for name, declared in self.control_inputs().items():
            described: dict[str, Any] = {"kind": f"CONTROL_SEQUENCE_{declared.kind.upper()}"}
            if declared.kind == CORRID:
                described["data_type"] = _type_name(declared.dtype or DType.INT64)
            else:
                values = [declared.false, declared.true]
                described[_FALSE_TRUE[declared.dtype or DType.INT32]] = values
            controls.append({"name": name, "control": [described]})
        states = [
            {
                "input_name": item.input,
                "output_name": item.output,
                "data_type": _type_name(item.dtype),
                "dims": list(item.shape),
            }
            for item in self.states
        ]
        return {
            "max_sequence_idle_microseconds": int(self.idle_s * 1e6),
            **strategy,
            "control_input": controls,
            "state": states,
        }


def settings_for(config: ModelConfig, model: Model, max_batch_size: int) -> SequenceSettings | None:
    """The sequence settings of a model, or None when sequence batching is off.

    Raises:
        ModelFailed: a control names an unknown kind.
    """
    enabled = (
        model.sequence_batching if config.sequence_batching is None else config.sequence_batching
    )
    if not enabled:
        return None
    controls: dict[str, Control] = {}
    for name, declared in model.sequence_controls.items():
        kind = declared.kind if isinstance(declared, Control) else declared
        if kind not in CONTROLS:
            raise ModelFailed(
                f"model {config.name}: sequence control {name!r} has kind {kind!r}; "
                f"expected one of {', '.join(CONTROLS)}"
            )
        controls[name] = declared if isinstance(declared, Control) else control(kind)
    listed = {spec.name for spec in model.outputs or ()}
    return SequenceSettings(
        config.name,
        config.sequence_strategy,
        config.max_sequence_idle_s,
        config.max_candidate_sequences,
        max_batch_size,
        tuple(model.sequence_state),
        controls,
        config.max_queue_delay_ms,
        frozenset(item.output for item in model.sequence_state if item.output in listed),
    )


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
        steps = [_step(pending) for pending in batch]
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
                _step(pending).live.state[item.input] = (
                    value[index].copy() if batched else value.copy()
                )
        return outputs


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
        (self.held if _step(pending).live.waiting else self.queue).append(pending)

    def release(self, live: Live) -> None:
        """Queue the held steps of ``live``, which has a slot now."""
        still = deque[Pending]()
        for item in self.held:
            (self.queue if _step(item).live is live else still).append(item)
        self.held = still

    def drop(self, predicate: Any) -> list[Pending]:
        dropped = super().drop(predicate)
        held = [item for item in self.held if predicate(item)]
        if held:
            self.held = deque(item for item in self.held if not predicate(item))
        return dropped + held

    def _admitter(self, head: Pending, now: float) -> Callable[[Pending], bool]:
        # A sequence's later steps wait behind its first one left in the queue.
        seen = {id(_step(head).live)}
        size = 1
        shapes = _state_shapes(head) if self.shaped else None

        def admit(item: Pending) -> bool:
            nonlocal size
            live = id(_step(item).live)
            joins = item.key == head.key and live not in seen and size < self.max_batch_size
            joins = joins and (shapes is None or _state_shapes(item) == shapes)
            seen.add(live)
            size += joins
            return joins

        return admit

    def _ordered(self, batch: list[Pending]) -> list[Pending]:
        if self.direct:
            batch.sort(key=lambda pending: _step(pending).live.slot)
        return batch


def _step(pending: Pending) -> Step:
    step = pending.step
    assert step is not None, "a sequence model's requests are admitted before they queue"
    return step


def _flag(model: str, params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"model {model}: parameter {key} must be true or false, got {value!r}")
    return value


def _state_shapes(pending: Pending) -> tuple[tuple[int, ...], ...]:
    return tuple(value.shape for value in _step(pending).live.state.values())


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


def _type_name(dtype: DType) -> str:
    """Triton's name of a type (TYPE_STRING for BYTES)."""
    return f"TYPE_{'STRING' if dtype is DType.BYTES else dtype.value}"


_FALSE_TRUE = {
    DType.INT32: "int32_false_true",
    DType.FP32: "fp32_false_true",
    DType.BOOL: "bool_false_true",
}
