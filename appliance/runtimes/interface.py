"""What every runtime model shares: its options, its declared tensors, batching.

A runtime model is an ordinary :class:`appliance.model.Model` whose entry
comes from a model repository (see ``appliance/repository.py``). Its options
carry ``path`` (the model file), ``version``, ``threads`` (intra-op threads,
1 by default: one process per instance, so instances rather than threads
use the cores), ``description``, and ``inputs``/``outputs`` from the model's
``config.toml`` as lists of ``{name, dtype, shape}`` tables.

Shapes are whole shapes, as metadata reports them: a batched model's first
dimension is the batch (-1). A model is batched when every input and output
has a free (-1) first dimension; it then takes up to
:data:`DEFAULT_MAX_BATCH_SIZE` rows per batch unless ``config.toml`` sets
``max_batch_size`` (0 turns batching off).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import TensorSpec
from appliance.model import Model
from appliance.repository import RUNTIME_PACKAGES

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

    def declare(self, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
        """Set the interface, and batching when every tensor has a free first dim."""
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.max_batch_size = DEFAULT_MAX_BATCH_SIZE if batchable(inputs, outputs) else 0


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
        specs.append(TensorSpec(name, dtype, tuple(int(d) for d in table["shape"])))
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
            by_name[name] = TensorSpec(name, spec.dtype, _refine(spec, table["shape"], where))
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
