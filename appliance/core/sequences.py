"""Stateful sequences: the request parameters that carry them, and a model's implicit state.

A request belongs to a sequence when its parameters hold ``sequence_id`` (a
non-zero integer or a non-empty string); ``sequence_start`` and
``sequence_end`` (booleans) mark its first and last step. These are Triton's
names, and every protocol that passes request parameters to the model
carries them the same way (see docs/models/sequences.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.core.dtypes import DType

SEQUENCE_ID = "sequence_id"
SEQUENCE_START = "sequence_start"
SEQUENCE_END = "sequence_end"
SEQUENCE_PARAMETERS = frozenset({SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END})

SequenceId = int | str

# The control inputs a sequence model may ask for (Triton's CONTROL_SEQUENCE_*).
START, END, READY, CORRID = "start", "end", "ready", "corrid"
CONTROLS = (START, END, READY, CORRID)

STRATEGIES = ("direct", "oldest")


@dataclass(frozen=True, slots=True)
class State:
    """One implicit state tensor of a sequence model.

    Before each step the worker feeds the sequence's current value as input
    ``input``; the model returns the new value as output ``output``, which
    the worker keeps for the sequence's next step and never sends to the
    client. ``shape`` is one sequence's value (no batch dimension); a new
    sequence starts with every element equal to ``initial``.
    """

    input: str
    output: str
    dtype: DType
    shape: tuple[int, ...]
    initial: Any = 0


def state(
    input: str, output: str, dtype: str | DType, shape: Sequence[int], initial: Any = 0
) -> State:
    """Build a :class:`State`; a shorthand for model declarations."""
    return State(input, output, DType(dtype), tuple(int(d) for d in shape), initial)


def sequence_of(parameters: Mapping[str, Any]) -> SequenceId | None:
    """The request's sequence id if it names one usable as a key, else None."""
    value = parameters.get(SEQUENCE_ID)
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return value if value not in (0, "") else None


def carries_sequence(parameters: Mapping[str, Any] | None) -> bool:
    """Whether any sequence parameter is present."""
    return bool(parameters) and not SEQUENCE_PARAMETERS.isdisjoint(parameters or ())
