"""What every runtime model shares: its options, its declared tensors, batching.

A runtime model is an ordinary :class:`appliance.model.Model` whose entry
comes from a model repository (see ``appliance/formats/repository.py``). Its options
carry ``path`` (the model file), ``version``, ``threads`` (intra-op threads,
1 by default: one process per instance, so instances rather than threads
use the cores), ``description``, and ``inputs``/``outputs`` from the model's
``config.toml`` as lists of ``{name, dtype, shape}`` tables.

Shapes are whole shapes, as metadata reports them: a batched model's first
dimension is the batch (-1). A model is batched when every input and output
has a free (-1) first dimension; it then takes up to
:data:`DEFAULT_MAX_BATCH_SIZE` rows per batch unless ``config.toml`` sets
``max_batch_size`` (0 turns batching off).

A sequence model's options may carry ``sequence_controls`` and
``sequence_state`` (config.pbtxt's control_input and state, see
appliance/core/sequences.py): inputs the worker fills on each step of a
sequence, and state outputs it keeps for the next. They are the model's
tensors but not its interface: :meth:`RuntimeModel.declare` leaves them out
of what clients see (a state output stays when the config lists it among
the outputs, as Triton lets a client read it).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.sequences import CORRID, Control, State, read_controls, read_states
from appliance.core.tensor import TensorSpec
from appliance.formats.repository import RUNTIME_PACKAGES
from appliance.model import Model

log = logging.getLogger("appliance.worker")

DEFAULT_MAX_BATCH_SIZE = 64
# The Python package and the extra that installs it, for each runtime.
EXTRAS = dict(RUNTIME_PACKAGES.values())


class ModelFileError(Exception):
    """The model file, or what its config.toml says of it, cannot be served."""


class RuntimeModel(Model):
    """A model served from a file; subclasses open the file in ``load()``."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.path = Path(str(options.get("path", "")))
        self.version = str(options.get("version", "1"))
        self.threads = int(options.get("threads", 1))
        self.description = str(options.get("description", ""))
        # Named from the model directory on, as messages name them: a status
        # note holds 256 bytes, and the repository is in the config.
        parts = self.path.parts
        self.file_name = "/".join(parts[-3:])
        config_file = (
            "config.pbtxt"
            if (self.path.parent.parent / "config.pbtxt").is_file()
            else "config.toml"
        )
        self.config_name = "/".join((*parts[-3:-2], config_file))
        # Fields of a config.pbtxt the appliance does not use: said once, at load.
        for note in options.get("config_notes", ()):
            log.warning("%s", note)
        self.pbtxt = config_file == "config.pbtxt"
        # Checked when the repository was read; a config snapshot is checked again.
        try:
            self.sequence_controls: dict[str, Control] = read_controls(
                list(options.get("sequence_controls", ()))
            )
        except ValueError as ex:
            raise ModelFileError(f"{self.config_name}: sequence_controls{ex}") from None
        try:
            self.sequence_state: list[State] = read_states(list(options.get("sequence_state", ())))
        except ValueError as ex:
            raise ModelFileError(f"{self.config_name}: sequence_state{ex}") from None
        # Whether the file gives its tensors' shapes (ONNX does; TorchScript's
        # are the config's, and its control and state shapes this class's own).
        self.declares_shapes = False
        # Every tensor of the model, the worker's inputs and kept outputs included.
        self.model_inputs: list[TensorSpec] = []
        self.model_outputs: list[TensorSpec] = []

    def declare(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
        """Set the interface, and batching when every tensor has a free first dim.

        ``inputs`` and ``outputs`` are all the model's tensors; those of its
        sequence controls and state are checked against the config and kept
        out of the interface clients see.

        Raises:
            ModelFileError: a control or state tensor is missing or of another type.
        """
        self._check_implicit(inputs, outputs)
        filled = {*self.sequence_controls, *(item.input for item in self.sequence_state)}
        listed = {str(table.get("name")) for table in self.options.get("outputs") or ()}
        kept = {item.output for item in self.sequence_state} - listed
        self.model_inputs, self.model_outputs = list(inputs), list(outputs)
        self.inputs = [spec for spec in inputs if spec.name not in filled]
        self.outputs = [spec for spec in outputs if spec.name not in kept]
        self.max_batch_size = DEFAULT_MAX_BATCH_SIZE if batchable(inputs, outputs) else 0
        self.sequence_state = [self._initial(item) for item in self.sequence_state]
        if self.sequence_controls or self.sequence_state:
            self.sequence_batching = True

    def implicit_specs(self, batched: bool) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """The control and state inputs and the state outputs, as the worker makes them.

        A runtime whose file does not name its tensors (TorchScript) adds
        these to the declared ones.
        """
        rows = (-1,) if batched else ()
        inputs = [
            TensorSpec(name, control.dtype or DType.INT64, (*rows, 1))
            for name, control in self.sequence_controls.items()
        ]
        inputs += [
            TensorSpec(item.input, item.dtype, (*rows, *item.shape)) for item in self.sequence_state
        ]
        outputs = [
            TensorSpec(item.output, item.dtype, (*rows, *item.shape))
            for item in self.sequence_state
        ]
        return inputs, outputs

    def check_implicit_shapes(self, batched: bool) -> None:
        """Check that the file takes its controls and states in the shapes the worker feeds.

        Called once the model's batching is settled (the config's
        max_batch_size may override what the file allows): a control is
        ``[rows, 1]`` when batched, ``[1]`` when not; a state its declared
        dims, after a rows dimension when batched. Only a file that declares
        its tensors' shapes (ONNX) is checked, so a mismatch is refused at
        load rather than by the runtime at the first request.

        Raises:
            ModelFileError: a control or state tensor of another shape.
        """
        if not self.declares_shapes:
            return
        wanted_in, wanted_out = self.implicit_specs(batched)
        fields = {name: self._field("control") for name in self.sequence_controls}
        for item in self.sequence_state:
            fields[item.input] = fields[item.output] = self._field("state")
        for wanted, have in ((wanted_in, self.model_inputs), (wanted_out, self.model_outputs)):
            declared = {spec.name: spec.shape for spec in have}
            for spec in wanted:
                shape = declared.get(spec.name)
                if shape is None or _fits(shape, spec.shape):
                    continue
                feeds = "a row per step" if batched else "no rows dimension: max_batch_size is 0"
                raise ModelFileError(
                    f"{self.config_name}: {fields[spec.name]}{spec.name}: {self.file_name} "
                    f"declares shape {list(shape)}, but the worker gives it "
                    f"{list(spec.shape)} ({feeds}; -1 is any size)"
                )

    def _check_implicit(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
        have_in = {spec.name: spec for spec in inputs}
        have_out = {spec.name: spec for spec in outputs}
        wanted = [
            (f"{self._field('control')}{name}", name, control.dtype, have_in, "input")
            for name, control in self.sequence_controls.items()
            if control.kind != CORRID or control.dtype is not None
        ]
        for item in self.sequence_state:
            field = f"{self._field('state')}{item.input}"
            wanted.append((field, item.input, item.dtype, have_in, "input"))
            wanted.append((field, item.output, item.dtype, have_out, "output"))
        for field, name, dtype, have, what in wanted:
            spec = have.get(name)
            if spec is None:
                raise ModelFileError(
                    f"{self.config_name}: {field}: {self.file_name} has no {what} {name!r} "
                    f"(its {what}s: {', '.join(have) or 'none'})"
                )
            if spec.dtype is not dtype:
                assert dtype is not None
                raise ModelFileError(
                    f"{self.config_name}: {field}: {what} {name} is {spec.dtype.value} in "
                    f"{self.file_name}, the config gives {dtype.value}"
                )

    def _initial(self, item: State) -> State:
        """The state with its ``initial_file`` read (as Triton reads it: row-major values)."""
        files = {
            str(table.get("input")): table.get("initial_file")
            for table in self.options.get("sequence_state", ())
        }
        name = files.get(item.input)
        if not name:
            return item
        path = self.path.parent.parent / str(name)
        shape = item.first_shape
        count = dtypes.element_count(shape)
        try:
            raw = path.read_bytes()
            if item.dtype is DType.BYTES:
                values = dtypes.unpack_bytes(raw, count)
            else:
                size = count * dtypes.item_size(item.dtype)
                if len(raw) != size:
                    raise ValueError(f"it holds {len(raw)} bytes, not {size}")
                values = np.frombuffer(raw, dtype=dtypes.to_numpy(item.dtype))
        except (OSError, ValueError) as ex:
            raise ModelFileError(
                f"{self.config_name}: {self._field('state')}{item.input}: initial state file "
                f"{name} does not hold {count} {item.dtype.value} values: {ex}"
            ) from None
        return dataclasses.replace(item, initial=values.reshape(shape))

    def _field(self, what: str) -> str:
        """How the config names a control or a state, for a message."""
        if self.pbtxt:
            return f"sequence_batching.{'control_input' if what == 'control' else 'state'} "
        return f"sequence_{'controls' if what == 'control' else 'state'} "


def _fits(declared: Sequence[int], fed: Sequence[int]) -> bool:
    """Whether a tensor of shape ``fed`` (-1: any size) can go where ``declared`` is."""
    return len(declared) == len(fed) and all(
        a == b or -1 in (a, b) for a, b in zip(declared, fed, strict=True)
    )


def import_runtime(package: str) -> Any:
    """Import onnxruntime or torch, with an error that says how to install it.

    An ``importlib`` call rather than an import statement: the extra is
    optional, and the runtime's package stays an ``Any`` to mypy (neither
    checking against torch's stubs nor needing onnxruntime's missing ones).

    Raises:
        ModelFileError: the package is not installed.
    """
    try:
        return importlib.import_module(package)
    except ImportError as ex:
        raise ModelFileError(
            f"this model needs {package}, which is not installed: "
            f"pip install 'appliance[{EXTRAS[package]}]' ({ex})"
        ) from None


def batchable(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """Return True when every input and output has a free first dimension."""
    specs = [*inputs, *outputs]
    return bool(specs) and all(spec.shape and spec.shape[0] == -1 for spec in specs)


def parse_dtype(name: str, where: str) -> DType:
    """Read a dtype name as KServe (FP32) or Triton's config (TYPE_FP32) spells it.

    Raises:
        ModelFileError: no such dtype.
    """
    try:
        return dtypes.parse_dtype(name, loose=True)
    except ValueError as ex:
        raise ModelFileError(f"{where}: {ex}") from None


def declared(options: Mapping[str, Any], what: str, where: str) -> list[dict[str, Any]] | None:
    """Return config.toml's ``inputs`` or ``outputs`` tables, None when absent."""
    tables = options.get(what)
    if tables is None:
        return None
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ModelFileError(f"{where}: {what} must be an array of tables")
    return [dict(table) for table in tables]


def specs_from_config(tables: list[dict[str, Any]], what: str, where: str) -> list[TensorSpec]:
    """Build specs from config.toml tables that must give name, dtype and shape.

    Raises:
        ModelFileError: a table lacks one of them, or names a tensor twice.
    """
    specs = []
    for index, table in enumerate(tables):
        for key in ("name", "dtype", "shape"):
            if key not in table:
                raise ModelFileError(f"{where}: {what}[{index}].{key} is missing")
        name = str(table["name"])
        dtype = parse_dtype(str(table["dtype"]), f"{where}: {what} {name}")
        shape = tuple(int(d) for d in table["shape"])
        specs.append(TensorSpec(name, dtype, shape, bool(table.get("optional", False))))
    _unique(specs, what, where)
    return specs


def merge_specs(
    found: list[TensorSpec], tables: list[dict[str, Any]] | None, what: str, where: str
) -> list[TensorSpec]:
    """Refine the specs a model file declares with config.toml's tables.

    A table names a tensor of the file; its dtype, when given, must be the
    file's, and its shape may fix a dimension the file leaves free (-1) but
    not change a fixed one. Tensors no table names keep the file's spec.

    Raises:
        ModelFileError: a table names no such tensor, or contradicts the file.
    """
    by_name = {spec.name: spec for spec in found}
    for index, table in enumerate(tables or ()):
        name = str(table.get("name", ""))
        spec = by_name.get(name)
        if spec is None:
            raise ModelFileError(
                f"{where}: {what}[{index}] names {name!r}, but the model's {what} are "
                f"{', '.join(by_name) or 'none'}"
            )
        if "dtype" in table:
            dtype = parse_dtype(str(table["dtype"]), f"{where}: {what} {name}")
            if dtype is not spec.dtype:
                raise ModelFileError(
                    f"{where}: {what} {name} is {spec.dtype.value} in the model file, "
                    f"not {dtype.value}"
                )
        if "shape" in table:
            spec = TensorSpec(name, spec.dtype, _refine(spec, table["shape"], where))
        by_name[name] = dataclasses.replace(
            spec, optional=bool(table.get("optional", spec.optional))
        )
    return [by_name[spec.name] for spec in found]


def _refine(spec: TensorSpec, raw: Sequence[int], where: str) -> tuple[int, ...]:
    shape = tuple(int(d) for d in raw)
    fits = len(shape) == len(spec.shape) and all(
        have in (-1, want) for have, want in zip(spec.shape, shape, strict=True)
    )
    if not fits:
        raise ModelFileError(
            f"{where}: {spec.name} has shape {list(spec.shape)} in the model file; "
            f"config.toml's {list(shape)} may only fix its free (-1) dimensions"
        )
    return shape


def _unique(specs: Sequence[TensorSpec], what: str, where: str) -> None:
    names = [spec.name for spec in specs]
    for name in names:
        if names.count(name) > 1:
            raise ModelFileError(f"{where}: {what} name {name!r} appears more than once")


def exception_text(ex: BaseException) -> str:
    """An exception as "ValueError: ...", its class named without its module (a
    runtime's messages quote the model's own errors so)."""
    return f"{type(ex).__name__}: {first_lines(ex)}"


def first_lines(ex: BaseException) -> str:
    """An exception's message, its first three lines joined (its class's name if empty)."""
    lines = str(ex).strip().splitlines()
    return " ".join(line.strip() for line in lines[:3]) or type(ex).__name__


def text_or_bytes(item: bytes) -> str | bytes:
    """A BYTES element as text where it is UTF-8, as JSON-minded model code expects it."""
    try:
        return item.decode()
    except UnicodeDecodeError:
        return item
