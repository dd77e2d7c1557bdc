"""A sequence model's settings: what its class declares and its [[models]] entry sets.

The strategy, the idle limit, the candidate sequences, the control inputs
(start, end, ready, correlation id) and the implicit state, read once at
load (:func:`settings_for`), and described as Triton's ModelSequenceBatching
for the model's config JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from appliance.config.settings import ModelConfig
from appliance.core.dtypes import DType
from appliance.core.sequences import CONTROLS, CORRID, Control, State, control
from appliance.errors import ModelFailed
from appliance.model import Model


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


def _type_name(dtype: DType) -> str:
    """Triton's name of a type (TYPE_STRING for BYTES)."""
    return f"TYPE_{'STRING' if dtype is DType.BYTES else dtype.value}"


_FALSE_TRUE = {
    DType.INT32: "int32_false_true",
    DType.FP32: "fp32_false_true",
    DType.BOOL: "bool_false_true",
}
