"""Stateful sequences: the request parameters that carry them, and a model's implicit state.

A request belongs to a sequence when its parameters hold ``sequence_id`` (a
non-zero integer or a non-empty string); ``sequence_start`` and
``sequence_end`` (booleans) mark its first and last step. These are Triton's
names, and every protocol that passes request parameters to the model
carries them the same way (see docs/models/sequences.md).

A model file (ONNX, TorchScript) declares its control inputs and implicit
state in its repository's config (config.pbtxt's ``control_input`` and
``state``, or the same as ``sequence_controls`` / ``sequence_state`` tables
in config.toml); :func:`read_controls` and :func:`read_states` read those
tables, for the repository's check at scan and the runtime at load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.core.dtypes import DType, parse_dtype

SEQUENCE_ID = "sequence_id"
SEQUENCE_START = "sequence_start"
SEQUENCE_END = "sequence_end"
SEQUENCE_PARAMETERS = frozenset({SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END})
# A step's flags as a model's Request carries them (Triton's
# TRITONSERVER_REQUEST_FLAG_SEQUENCE_START and _END).
FLAG_START, FLAG_END = 1, 2

SequenceId = int | str

# The control inputs a sequence model may ask for (Triton's CONTROL_SEQUENCE_*).
START, END, READY, CORRID = "start", "end", "ready", "corrid"
CONTROLS = (START, END, READY, CORRID)

STRATEGIES = ("direct", "oldest")
# The types a correlation id control may take (Triton's), and the flags' types.
CORRID_DTYPES = (DType.INT32, DType.INT64, DType.UINT32, DType.UINT64, DType.BYTES)
FLAG_DTYPES = (DType.INT32, DType.FP32, DType.BOOL)


@dataclass(frozen=True, slots=True)
class Control:
    """One control input: what the worker fills it with on each step.

    ``kind`` is one of :data:`CONTROLS`. A flag (start, end, ready) is
    ``false`` or ``true`` in ``dtype`` (Triton's int32_false_true,
    fp32_false_true, bool_false_true); a correlation id is the sequence id in
    ``dtype``, or with ``dtype`` None, INT64 for integer ids and BYTES for
    string ones (what a Python model class gets by naming the kind only).
    """

    kind: str
    dtype: DType | None = DType.INT32
    false: Any = 0
    true: Any = 1


def control(kind: str) -> Control:
    """The control a Python model class means by naming its kind only."""
    return Control(kind, None) if kind == CORRID else Control(kind)


@dataclass(frozen=True, slots=True)
class State:
    """One implicit state tensor of a sequence model.

    Before each step the worker feeds the sequence's current value as input
    ``input``; the model returns the new value as output ``output``, which
    the worker keeps for the sequence's next step and never sends to the
    client. ``shape`` is one sequence's value (no batch dimension; -1 for a
    size that may change from step to step, as Triton allows); a new
    sequence starts with every element equal to ``initial`` (a scalar, or an
    array of ``start_shape`` read from a file), in ``start_shape``: by
    default ``shape`` with 1 for each free size, as Triton starts one.
    """

    input: str
    output: str
    dtype: DType
    shape: tuple[int, ...]
    initial: Any = 0
    start_shape: tuple[int, ...] | None = None

    @property
    def first_shape(self) -> tuple[int, ...]:
        """The shape of a new sequence's state."""
        if self.start_shape is not None:
            return self.start_shape
        return tuple(1 if dim < 0 else dim for dim in self.shape)

    @property
    def fixed(self) -> bool:
        """Whether every step's state has the one shape."""
        return all(dim >= 0 for dim in self.shape)


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


def read_controls(tables: object) -> dict[str, Control]:
    """Read ``sequence_controls`` tables (name, kind, dtype, false_true) into controls.

    Raises:
        ValueError: a table is malformed; the message starts with its index.
    """
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ValueError("expected an array of tables (name, kind, dtype, false_true)")
    controls: dict[str, Control] = {}
    for index, table in enumerate(tables):
        where = f"[{index}]"
        extra = sorted(set(table) - {"name", "kind", "dtype", "false_true"})
        if extra:
            raise ValueError(f"{where}: unknown key {extra[0]!r}; expected name, kind, dtype")
        name, kind = table.get("name"), table.get("kind")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name: expected an input name")
        if name in controls:
            raise ValueError(f"{where}.name: {name!r} is named by two controls")
        if kind not in CONTROLS:
            raise ValueError(f"{where}.kind: expected one of {', '.join(CONTROLS)}, got {kind!r}")
        if any(other.kind == kind for other in controls.values()):
            raise ValueError(f"{where}.kind: a second {kind} control")
        dtype = _dtype(where, table.get("dtype", "INT64" if kind == CORRID else "INT32"))
        controls[name] = (
            _corrid(where, table, dtype) if kind == CORRID else _flag(where, table, kind, dtype)
        )
    return controls


def _corrid(where: str, table: Mapping[str, Any], dtype: DType) -> Control:
    if dtype not in CORRID_DTYPES:
        raise ValueError(f"{where}.dtype: a correlation id is not {dtype.value}")
    if "false_true" in table:
        raise ValueError(f"{where}.false_true: a correlation id has no flag values")
    return Control(CORRID, dtype)


def _flag(where: str, table: Mapping[str, Any], kind: str, dtype: DType) -> Control:
    if dtype not in FLAG_DTYPES:
        allowed = ", ".join(d.value for d in FLAG_DTYPES)
        raise ValueError(f"{where}.dtype: a flag is one of {allowed}, not {dtype.value}")
    pair = table.get("false_true", [False, True] if dtype is DType.BOOL else [0, 1])
    if (
        not isinstance(pair, list)
        or len(pair) != 2
        or not all(isinstance(v, int | float) for v in pair)
    ):
        raise ValueError(f"{where}.false_true: expected two values, got {pair!r}")
    cast = {DType.INT32: int, DType.FP32: float, DType.BOOL: bool}[dtype]
    return Control(kind, dtype, cast(pair[0]), cast(pair[1]))


def read_states(tables: object) -> list[State]:
    """Read ``sequence_state`` tables into states (``initial_file`` is left to the runtime).

    Keys: ``input``, ``output``, ``dtype``, ``shape`` (-1 for a free size),
    and optionally ``initial_shape`` (the shape a sequence starts with,
    every size given) and ``initial_file`` (a path inside the model
    directory; read by the runtime).

    Raises:
        ValueError: a table is malformed; the message starts with its index.
    """
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ValueError("expected an array of tables (input, output, dtype, shape)")
    states: list[State] = []
    keys = {"input", "output", "dtype", "shape", "initial_shape", "initial_file"}
    for index, table in enumerate(tables):
        where = f"[{index}]"
        extra = sorted(set(table) - keys)
        if extra:
            raise ValueError(f"{where}: unknown key {extra[0]!r}; expected {', '.join(keys)}")
        for key in ("input", "output"):
            if not isinstance(table.get(key), str) or not table[key]:
                raise ValueError(f"{where}.{key}: expected a tensor name")
        shape = _shape(f"{where}.shape", table.get("shape"), -1)
        start = table.get("initial_shape")
        start_shape = None if start is None else _shape(f"{where}.initial_shape", start, 0)
        if start_shape is not None and not _fits(shape, start_shape):
            raise ValueError(
                f"{where}.initial_shape: {list(start_shape)} does not fit the state's shape "
                f"{list(shape)}"
            )
        initial_file = table.get("initial_file")
        if initial_file is not None and (
            not isinstance(initial_file, str)
            or initial_file.startswith(("/", "."))
            or ".." in initial_file.split("/")
        ):
            raise ValueError(f"{where}.initial_file: expected a path inside the model directory")
        names = [name for item in states for name in (item.input, item.output)]
        for key in ("input", "output"):
            if table[key] in names:
                raise ValueError(f"{where}.{key}: {table[key]!r} is named by two states")
        dtype = _dtype(where, table.get("dtype"))
        states.append(State(table["input"], table["output"], dtype, shape, 0, start_shape))
    return states


def _dtype(where: str, raw: object) -> DType:
    try:
        return parse_dtype(raw, loose=True)
    except ValueError as ex:
        raise ValueError(f"{where}.dtype: {ex}") from None


def _shape(where: str, raw: object, least: int) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= least for d in raw
    ):
        wanted = "sizes (-1 = any)" if least < 0 else "sizes"
        raise ValueError(f"{where}: expected a list of {wanted}, got {raw!r}")
    return tuple(raw)


def _fits(shape: Sequence[int], concrete: Sequence[int]) -> bool:
    return len(shape) == len(concrete) and all(
        want in (-1, have) for want, have in zip(shape, concrete, strict=True)
    )
