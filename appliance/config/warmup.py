"""Warmup samples: requests a model instance runs before it is ready (Triton's ``model_warmup``).

A sample names each input's dtype and dims (without the batch dimension) and
where its data comes from: zeros, random values, or a file of raw row-major
data in the model directory's ``warmup/`` folder (BYTES elements each a
4-byte little-endian length and the bytes, as Triton reads them). A sample
is ``batch_size`` requests of one row each (for a batched model) run as one
batch, ``count`` times (0 counts as once), as Triton runs them.

config.pbtxt's ``model_warmup`` and config.toml's ``[[warmup]]`` tables are
read into the same tables (:func:`check` says what is wrong with one), which
reach the model worker among its options; worker/warmup.py runs them.

Rule: numpy and the core's dtypes only; the master and the repository scan
import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core import dtypes
from appliance.core.dtypes import DType

OPTION = "warmup"
FOLDER = "warmup"
ZERO, RANDOM = "zero", "random"
_SOURCES = (ZERO, RANDOM)


@dataclass(frozen=True, slots=True)
class SampleInput:
    name: str
    dtype: DType
    dims: tuple[int, ...]
    # "zero", "random", or a file's absolute path.
    data: str


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    batch_size: int
    count: int
    inputs: tuple[SampleInput, ...]

    def request(self, batched: bool) -> dict[str, npt.NDArray[Any]]:
        """One request's inputs: a row of each when ``batched``, else the dims alone.

        A sample of ``batch_size`` n is n such requests, as Triton sends them.

        Raises:
            ValueError: a data file does not hold what dtype and dims ask for.
        """
        arrays = {}
        for item in self.inputs:
            one = _data(item, self.name)
            arrays[item.name] = one[np.newaxis] if batched else one
        return arrays


def check(tables: object, model_dir: Path, max_batch_size: int) -> str:
    """What is wrong with a model's warmup tables ("" when nothing is)."""
    try:
        read(tables, model_dir, max_batch_size)
    except ValueError as ex:
        return str(ex)
    return ""


def read(tables: object, model_dir: Path, max_batch_size: int) -> list[Sample]:
    """The samples of a model's warmup tables.

    Raises:
        ValueError: a table is malformed, a batch size does not fit the model,
            or a data file is missing (the sample and input named).
    """
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ValueError(": expected an array of tables (name, batch_size, count, inputs)")
    return [_sample(index, table, model_dir, max_batch_size) for index, table in enumerate(tables)]


def _sample(index: int, table: Mapping[str, Any], model_dir: Path, max_batch: int) -> Sample:
    name = str(table.get("name") or f"sample {index}")
    where = f"[{index}] ({name})"
    extra = sorted(set(table) - {"name", "batch_size", "count", "inputs"})
    if extra:
        raise ValueError(
            f"{where}: unknown key {extra[0]!r}; expected name, batch_size, count, inputs"
        )
    batch_size, count = table.get("batch_size", 1), table.get("count", 0)
    for key, value in (("batch_size", batch_size), ("count", count)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}.{key}: expected a whole number, got {value!r}")
    if batch_size < 1:
        raise ValueError(f"{where}.batch_size: must be at least 1")
    if max_batch == 0 and batch_size > 1:
        raise ValueError(
            f"{where}.batch_size: {batch_size}, but the model does not batch (max_batch_size 0); "
            "use 1"
        )
    if batch_size > max_batch > 0:
        raise ValueError(f"{where}.batch_size: {batch_size} exceeds max_batch_size {max_batch}")
    inputs = table.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValueError(f"{where}.inputs: expected tables of name, dtype, dims and data")
    items = tuple(_input(f"{where}.inputs", item, model_dir) for item in inputs)
    return Sample(name, batch_size, count, items)


def _input(where: str, table: object, model_dir: Path) -> SampleInput:
    if not isinstance(table, Mapping) or not isinstance(table.get("name"), str):
        raise ValueError(f"{where}: expected a table with a name")
    name = table["name"]
    where = f"{where} ({name})"
    try:
        dtype = dtypes.parse_dtype(str(table.get("dtype", "")), loose=True)
    except ValueError as ex:
        raise ValueError(f"{where}.dtype: {ex}") from None
    dims = table.get("dims", [])
    if not isinstance(dims, list) or not all(isinstance(d, int) and d >= 0 for d in dims):
        raise ValueError(f"{where}.dims: expected sizes (no -1 in a warmup sample), got {dims!r}")
    data = str(table.get("data", ""))
    if data not in _SOURCES:
        if not data or "/" in data or data.startswith("."):
            raise ValueError(
                f"{where}.data: expected 'zero', 'random' or a file name in "
                f"{model_dir.name}/{FOLDER}/, got {data!r}"
            )
        path = model_dir / FOLDER / data
        if not path.is_file():
            raise ValueError(f"{where}.data: {model_dir.name}/{FOLDER}/{data} is not there")
        data = str(path)
    return SampleInput(name, dtype, tuple(dims), data)


def _data(item: SampleInput, sample: str) -> npt.NDArray[Any]:
    count = dtypes.element_count(item.dims)
    if item.data == ZERO:
        if item.dtype is DType.BYTES:
            return np.full(item.dims, b"", dtype=object)
        return np.zeros(item.dims, dtypes.to_numpy(item.dtype))
    if item.data == RANDOM:
        return _random(item.dtype, item.dims)
    raw = Path(item.data).read_bytes()
    where = f"warmup sample {sample!r} input {item.name}: {Path(item.data).name}"
    if item.dtype is DType.BYTES:
        try:
            return dtypes.unpack_bytes(raw, count).reshape(item.dims)
        except ValueError as ex:
            raise ValueError(f"{where}: {ex}") from None
    want = count * dtypes.item_size(item.dtype)
    if len(raw) < want:
        raise ValueError(
            f"{where} holds {len(raw)} bytes; {item.dtype.value} {list(item.dims)} needs {want}"
        )
    array = np.frombuffer(raw[:want], dtypes.to_numpy(item.dtype))
    return array.reshape(item.dims).copy()


def _random(dtype: DType, dims: tuple[int, ...]) -> npt.NDArray[Any]:
    rng = np.random.default_rng()
    if dtype is DType.BYTES:
        flat = [rng.bytes(int(rng.integers(1, 9))) for _ in range(dtypes.element_count(dims))]
        return np.array(flat, dtype=object).reshape(dims)
    numpy_type = dtypes.to_numpy(dtype)
    if numpy_type == np.bool_:
        return rng.integers(0, 2, dims).astype(np.bool_)
    if numpy_type.kind in "iu":
        return rng.integers(0, 100, dims).astype(numpy_type)
    return rng.random(dims).astype(numpy_type)
