"""config.pbtxt's ``sequence_batching``, read into the appliance's sequence settings.

The strategy (direct, oldest), idle time, ``control_input`` (start, end,
ready, correlation id in the declared type and false/true values) and
implicit ``state`` (with a zero or a file ``initial_state``), as the
``sequence_controls`` and ``sequence_state`` tables a config.toml would
hold; Triton's rules for them are checked here (appliance/formats/triton/config_pbtxt.py reads
the rest of the config).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from appliance._generated import triton_model_config_pb2 as mc
from appliance.core.dtypes import DType
from appliance.core.sequences import CORRID_DTYPES


class PbtxtError(ValueError):
    """A config.pbtxt that does not parse, or asks for what cannot be served."""


class SequenceFields:
    """The sequence_batching part of a config.pbtxt reader (pbtxt._Reader)."""

    config: Any
    model_dir: Path
    notes: list[str]

    def _sequences(self) -> dict[str, Any]:
        sequences = self.config.sequence_batching
        if sequences.iterative_sequence:
            raise PbtxtError("sequence_batching.iterative_sequence: not served")
        settings: dict[str, Any] = {"sequence_batching": True}
        if sequences.control_input:
            settings["sequence_controls"] = [
                self._control(i, item) for i, item in enumerate(sequences.control_input)
            ]
        if sequences.state:
            settings["sequence_state"] = [
                self._state(i, item) for i, item in enumerate(sequences.state)
            ]
        self._no_twice(settings)
        if sequences.max_sequence_idle_microseconds:
            settings["max_sequence_idle_s"] = sequences.max_sequence_idle_microseconds / 1e6
        if sequences.HasField("oldest"):
            oldest = sequences.oldest
            settings["sequence_strategy"] = "oldest"
            if oldest.max_candidate_sequences:
                settings["max_candidate_sequences"] = int(oldest.max_candidate_sequences)
            if oldest.max_queue_delay_microseconds:
                settings["max_queue_delay_ms"] = oldest.max_queue_delay_microseconds / 1000
            for field in ("preferred_batch_size", "preserve_ordering"):
                if is_set(oldest, field):
                    self.notes.append(f"sequence_batching.oldest.{field} is not used")
        else:
            settings["sequence_strategy"] = "direct"
            direct = sequences.direct
            if direct.max_queue_delay_microseconds:
                settings["max_queue_delay_ms"] = direct.max_queue_delay_microseconds / 1000
            if direct.minimum_slot_utilization:
                self.notes.append("sequence_batching.direct.minimum_slot_utilization is not used")
        return settings

    def _control(self, index: int, item: Any) -> dict[str, Any]:
        """One control_input as a ``sequence_controls`` table (Triton's rules checked)."""
        where = f"sequence_batching.control_input[{index}] ({item.name or 'no name'})"
        if not item.name:
            raise PbtxtError(f"{where}: name is missing")
        if len(item.control) != 1:
            raise PbtxtError(
                f"{where}.control: expected exactly one control, got {len(item.control)}"
            )
        control = item.control[0]
        kind = mc.ModelSequenceBatching.Control.Kind.Name(control.kind)
        short = kind.removeprefix("CONTROL_SEQUENCE_").lower()
        pairs: dict[str, tuple[str, list[Any]]] = {
            "int32_false_true": ("INT32", [int(v) for v in control.int32_false_true]),
            "fp32_false_true": ("FP32", [float(v) for v in control.fp32_false_true]),
            "bool_false_true": ("BOOL", [bool(v) for v in control.bool_false_true]),
        }
        given = {field: pair for field, pair in pairs.items() if is_set(control, field)}
        if short == "corrid":
            if given:
                raise PbtxtError(f"{where}.{next(iter(given))}: {kind} takes data_type, not values")
            dtype = mc.DataType.Name(control.data_type).removeprefix("TYPE_")
            dtype = "BYTES" if dtype == "STRING" else dtype
            if dtype not in {item.value for item in CORRID_DTYPES}:
                names = [f"TYPE_{'STRING' if d is DType.BYTES else d.value}" for d in CORRID_DTYPES]
                raise PbtxtError(
                    f"{where}.data_type: {kind} is {', '.join(names[:-1])} or {names[-1]}, "
                    f"not {mc.DataType.Name(control.data_type)}"
                )
            return {"name": item.name, "kind": short, "dtype": dtype}
        if control.data_type:
            raise PbtxtError(f"{where}.data_type: {kind} takes its type from its false/true values")
        if len(given) != 1:
            raise PbtxtError(
                f"{where}: {kind} needs one of int32_false_true, fp32_false_true or bool_false_true"
            )
        field, (dtype, values) = next(iter(given.items()))
        if len(values) != 2:
            raise PbtxtError(f"{where}.{field}: expected [false, true], got {values}")
        return {"name": item.name, "kind": short, "dtype": dtype, "false_true": values}

    def _state(self, index: int, item: Any) -> dict[str, Any]:
        """One state as a ``sequence_state`` table; its initial_state checked here."""
        where = f"sequence_batching.state[{index}]"
        for field in ("input_name", "output_name"):
            if not getattr(item, field):
                raise PbtxtError(f"{where}.{field} is missing")
        where = f"{where} ({item.input_name})"
        if item.data_type in (mc.TYPE_INVALID, mc.TYPE_BF16):
            name = mc.DataType.Name(item.data_type)
            raise PbtxtError(f"{where}.data_type: {name} is not one of the appliance's types")
        dims = [int(d) for d in item.dims]
        if any(d < -1 for d in dims):
            raise PbtxtError(f"{where}.dims: {dims} holds a size below -1")
        for field in ("use_same_buffer_for_input_output", "use_growable_memory"):
            if is_set(item, field):
                self.notes.append(f"{where}.{field} is not used (the state is a copy per step)")
        dtype = mc.DataType.Name(item.data_type).removeprefix("TYPE_")
        table: dict[str, Any] = {
            "input": item.input_name,
            "output": item.output_name,
            "dtype": "BYTES" if dtype == "STRING" else dtype,
            "shape": dims,
        }
        if len(item.initial_state) > 1:
            raise PbtxtError(
                f"{where}.initial_state: expected at most one, got {len(item.initial_state)}"
            )
        for initial in item.initial_state:
            table.update(self._initial(where, item, initial, dims))
        return table

    def _initial(self, where: str, item: Any, initial: Any, dims: list[int]) -> dict[str, Any]:
        where = f"{where}.initial_state"
        if initial.data_type != item.data_type:
            raise PbtxtError(
                f"{where}.data_type: {mc.DataType.Name(initial.data_type)} is not the state's "
                f"{mc.DataType.Name(item.data_type)}"
            )
        shape = [int(d) for d in initial.dims]
        fits = len(shape) == len(dims) and all(
            have >= 0 and want in (-1, have) for want, have in zip(dims, shape, strict=True)
        )
        if not fits:
            raise PbtxtError(f"{where}.dims: {shape} does not fill the state's dims {dims}")
        choice = initial.WhichOneof("state_data")
        if choice is None:
            raise PbtxtError(f"{where}: set zero_data: true or data_file")
        if choice == "zero_data":
            if not initial.zero_data:
                raise PbtxtError(f"{where}.zero_data: false leaves the state undefined; set true")
            return {"initial_shape": shape}
        name = initial.data_file
        if not name or "/" in name or name.startswith("."):
            raise PbtxtError(f"{where}.data_file: expected a file name, got {name!r}")
        # Triton's place for it: initial_state/ in the model directory.
        if not (self.model_dir / "initial_state" / name).is_file():
            raise PbtxtError(
                f"{where}.data_file: {self.model_dir.name}/initial_state/{name} is not there"
            )
        return {"initial_shape": shape, "initial_file": f"initial_state/{name}"}

    def _no_twice(self, settings: dict[str, Any]) -> None:
        """Refuse a kind of control or a tensor named twice, and an input the worker fills
        that ``input`` also asks clients for."""
        filled: dict[str, str] = {}
        kinds: set[str] = set()
        for index, table in enumerate(settings.get("sequence_controls", ())):
            where = f"sequence_batching.control_input[{index}] ({table['name']})"
            if table["kind"] in kinds:
                kind = f"CONTROL_SEQUENCE_{table['kind'].upper()}"
                raise PbtxtError(f"{where}: a second {kind} control (one of each kind)")
            kinds.add(table["kind"])
            if table["name"] in filled:
                raise PbtxtError(f"{where}: a second control_input of that name")
            filled[table["name"]] = "control_input"
        outputs: set[str] = set()
        for index, table in enumerate(settings.get("sequence_state", ())):
            where = f"sequence_batching.state[{index}] ({table['input']})"
            if table["input"] in filled or table["output"] in outputs:
                raise PbtxtError(f"{where}: its input_name or output_name is named twice")
            filled[table["input"]] = "state"
            outputs.add(table["output"])
        for index, tensor in enumerate(self.config.input):
            if tensor.name in filled:
                raise PbtxtError(
                    f"input[{index}] ({tensor.name}): it is a sequence_batching."
                    f"{filled[tensor.name]}, which the worker fills on each step; leave it out "
                    "of input"
                )


def is_set(message: Message, field: str) -> bool:
    """Whether a field of ``message`` holds anything (a repeated one, any element)."""
    return any(described.name == field for described, _ in message.ListFields())
