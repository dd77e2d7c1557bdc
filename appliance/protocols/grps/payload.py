"""GRPS payloads between the wire codecs and the model binding.

A :class:`Payload` is one GrpsMessage's user data, decoded: the JSON codec
(``codec.py``) and the protobuf codec (``pbcodec.py``) both produce and
consume it, and ``bind.py`` maps it onto a model's tensors and back. It also holds
GRPS's dtype table and builds tensors from flat GenericTensor data with the
checks every transport needs (element counts, value ranges).

This module is pure: no falcon, grpc, sockets.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.protocols.grps.errors import GrpsError, bad_request

Array = npt.NDArray[Any]


class Kind(enum.StrEnum):
    """The members of GrpsMessage's ``data_oneof``."""

    BIN_DATA = "bin_data"
    STR_DATA = "str_data"
    GTENSORS = "gtensors"
    NDARRAY = "ndarray"
    GMAP = "gmap"


class MapField(enum.StrEnum):
    """GenericMapData's typed maps; each value type has a tensor dtype."""

    S_S = "s_s"
    S_B = "s_b"
    S_I32 = "s_i32"
    S_I64 = "s_i64"
    S_F = "s_f"
    S_D = "s_d"


MAP_DTYPES: dict[MapField, DType] = {
    MapField.S_S: DType.BYTES,
    MapField.S_B: DType.BYTES,
    MapField.S_I32: DType.INT32,
    MapField.S_I64: DType.INT64,
    MapField.S_F: DType.FP32,
    MapField.S_D: DType.FP64,
}


@dataclass(slots=True)
class Payload:
    """One GrpsMessage's data; which attribute is used depends on ``kind``.

    - BIN_DATA, STR_DATA: ``data`` (bytes, or str for STR_DATA).
    - GTENSORS: ``tensors``, (name, tensor) pairs; a name may be "".
    - NDARRAY: ``array``, the nested list as a float64 numpy array.
    - GMAP: ``gmap``, entries by map then key; values are str, bytes, int
      or float.
    """

    kind: Kind
    model: str = ""
    data: bytes | str = b""
    tensors: list[tuple[str, Tensor]] = field(default_factory=list)
    array: Array | None = None
    gmap: dict[MapField, dict[str, Any]] = field(default_factory=dict)


class GrpsType(enum.IntEnum):
    """SPEC: grps.md "gtensors" — DataType numbers, on the wire and in JSON."""

    DT_INVALID = 0
    DT_UINT8 = 1
    DT_INT8 = 2
    DT_INT16 = 3
    DT_INT32 = 4
    DT_INT64 = 5
    DT_FLOAT16 = 6
    DT_FLOAT32 = 7
    DT_FLOAT64 = 8
    DT_STRING = 9


# Each GRPS type: the appliance dtype and the flat_* field that carries it.
GRPS_TYPES: dict[GrpsType, tuple[DType, str]] = {
    GrpsType.DT_UINT8: (DType.UINT8, "flat_uint8"),
    GrpsType.DT_INT8: (DType.INT8, "flat_int8"),
    GrpsType.DT_INT16: (DType.INT16, "flat_int16"),
    GrpsType.DT_INT32: (DType.INT32, "flat_int32"),
    GrpsType.DT_INT64: (DType.INT64, "flat_int64"),
    GrpsType.DT_FLOAT16: (DType.FP16, "flat_float16"),
    GrpsType.DT_FLOAT32: (DType.FP32, "flat_float32"),
    GrpsType.DT_FLOAT64: (DType.FP64, "flat_float64"),
    GrpsType.DT_STRING: (DType.BYTES, "flat_string"),
}
FLAT_FIELDS: tuple[str, ...] = tuple(flat for _dtype, flat in GRPS_TYPES.values())
TYPE_OF_FIELD: dict[str, GrpsType] = {flat: gt for gt, (_dtype, flat) in GRPS_TYPES.items()}

# Appliance dtypes GRPS has no DataType for travel in the next wider one.
_OUTPUT_TYPES: dict[DType, GrpsType] = {
    DType.BOOL: GrpsType.DT_UINT8,
    DType.UINT8: GrpsType.DT_UINT8,
    DType.UINT16: GrpsType.DT_INT32,
    DType.UINT32: GrpsType.DT_INT64,
    DType.UINT64: GrpsType.DT_INT64,
    DType.INT8: GrpsType.DT_INT8,
    DType.INT16: GrpsType.DT_INT16,
    DType.INT32: GrpsType.DT_INT32,
    DType.INT64: GrpsType.DT_INT64,
    DType.FP16: GrpsType.DT_FLOAT16,
    DType.FP32: GrpsType.DT_FLOAT32,
    DType.FP64: GrpsType.DT_FLOAT64,
    DType.BYTES: GrpsType.DT_STRING,
}

# The range a flat_* field may hold for its dtype: the proto types are wider
# (flat_uint8 is uint32, flat_int8 and flat_int16 are int32).
_INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.UINT8: (0, (1 << 8) - 1),
    DType.INT8: (-(1 << 7), (1 << 7) - 1),
    DType.INT16: (-(1 << 15), (1 << 15) - 1),
    DType.INT32: (-(1 << 31), (1 << 31) - 1),
    DType.INT64: (-(1 << 63), (1 << 63) - 1),
}
MAX_DIMS = 64
MAX_ELEMENTS = 1 << 59
_FLOAT_MAX = {DType.FP16: 65504.0, DType.FP32: float(np.finfo(np.float32).max)}
_SPECIAL_FLOATS = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}


def parse_grps_type(value: object, where: str) -> GrpsType:
    """Return a DataType given by name ("DT_FLOAT32") or number (7)."""
    try:
        if isinstance(value, str):
            return GrpsType[value]
        if isinstance(value, int) and not isinstance(value, bool):
            return GrpsType(value)
    except (KeyError, ValueError):
        pass
    names = ", ".join(t.name for t in GrpsType if t is not GrpsType.DT_INVALID)
    raise bad_request(f"{where}: unknown dtype {value!r}; expected one of {names} or 1..9")


def output_type(dtype: DType) -> GrpsType:
    return _OUTPUT_TYPES[dtype]


def tensor_from_flat(
    where: str, grps_type: GrpsType, shape: list[int] | None, values: Array
) -> Tensor:
    """Build a tensor from a GenericTensor's shape and flat values.

    ``values`` is already of the dtype's numpy type (object array of bytes
    for DT_STRING). A missing shape means 1-D.

    Raises:
        GrpsError: 400, the shape does not hold that many elements.
    """
    dtype = GRPS_TYPES[grps_type][0]
    dims = [len(values)] if shape is None else shape
    # numpy refuses more dims, or dims whose product (zeros aside) passes
    # 2**63 bytes, even for an empty tensor.
    if len(dims) > MAX_DIMS or math.prod(max(dim, 1) for dim in dims) > MAX_ELEMENTS:
        raise bad_request(
            f"{where}: shape {dims} is too big: at most {MAX_DIMS} dims whose product "
            f"(zeros aside) is at most {MAX_ELEMENTS}"
        )
    count = dtypes.element_count(dims)
    if count != len(values):
        raise bad_request(
            f"{where}: shape {dims} holds {count} elements but "
            f"{GRPS_TYPES[grps_type][1]} has {len(values)}"
        )
    return Tensor(dtype, tuple(dims), values.reshape(dims))


def check_shape(where: str, shape: object) -> list[int]:
    """Return a GenericTensor shape: a list of uint32 dimensions."""
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 32 for d in shape
    ):
        raise bad_request(f"{where}: shape must be a list of non-negative integers, not {shape!r}")
    return shape


def numbers_to_array(where: str, values: object, dtype: DType) -> Array:
    """Convert a JSON list of numbers to ``dtype``, checking every value fits.

    Integers may be given as numbers or decimal strings (proto3 JSON writes
    int64 as strings), floats also as "NaN", "Infinity" and "-Infinity".

    Raises:
        GrpsError: 400, naming the field and the offending value.
    """
    if not isinstance(values, list):
        raise bad_request(f"{where} must be a list of numbers, not {type(values).__name__}")
    if not values:
        return np.empty(0, dtype=dtypes.to_numpy(dtype))
    try:
        raw = np.asarray(values)
    except ValueError:
        raise bad_request(f"{where} must be a flat list of numbers") from None
    if raw.ndim != 1:
        raise bad_request(f"{where} must be a flat list of numbers, not a nested one")
    # numpy reads a list mixing floats (or uint64-sized values) with other
    # integers as float64, which rounds integers beyond 2**53: convert those
    # for integer types one value at a time.
    if raw.dtype.kind not in "iuf" or (raw.dtype.kind == "f" and dtype in _INT_RANGES):
        raw = _from_text(where, values, dtype)
    return fit_numbers(where, raw, dtype)


def _from_text(where: str, values: list[Any], dtype: DType) -> Array:
    """Convert a list mixing numbers and numeric strings, one value at a time."""
    is_float = dtype in (DType.FP16, DType.FP32, DType.FP64)
    out: list[Any] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise bad_request(f"{where}: {value!r} is not a number")
        if isinstance(value, str):
            try:
                value = _SPECIAL_FLOATS[value] if is_float and value in _SPECIAL_FLOATS else value
                value = float(value) if is_float else int(value)
            except ValueError:
                raise bad_request(f"{where}: {value!r} is not a number") from None
        elif isinstance(value, float) and not is_float and value.is_integer():
            value = int(value)
        out.append(value)
    try:
        return np.asarray(out, dtype=np.float64 if is_float else None)
    except OverflowError:
        raise bad_request(f"{where}: a value is out of range for {dtype.value}") from None


def fit_numbers(where: str, raw: Array, dtype: DType) -> Array:
    """Cast numbers to ``dtype``, refusing values it cannot hold."""
    target = dtypes.to_numpy(dtype)
    if raw.dtype == target:
        return raw  # already of the type, so every value fits
    if raw.dtype.kind == "O":
        raise bad_request(f"{where}: a value is out of range for {dtype.value}")
    if dtype in _INT_RANGES:
        if raw.dtype.kind == "f" and (not np.all(np.isfinite(raw)) or np.any(raw != np.floor(raw))):
            raise bad_request(f"{where}: {dtype.value} values must be whole numbers")
        low, high = _INT_RANGES[dtype]
        if raw.size and (raw.min() < low or raw.max() > high):
            bad = raw[(raw < low) | (raw > high)][0]
            raise bad_request(f"{where}: {bad} is out of range for {dtype.value} [{low}, {high}]")
        return raw.astype(target)
    # A value fits when it rounds to a finite one: FP32's largest written in
    # its shortest form (3.4028235e+38) is a hair above it and must pass.
    with np.errstate(over="ignore", invalid="ignore"):
        cast = raw.astype(target)
    if dtype in _FLOAT_MAX and np.any(np.isinf(cast) & np.isfinite(raw)):
        limit = _FLOAT_MAX[dtype]
        raise bad_request(f"{where}: a value is out of range for {dtype.value} (max {limit})")
    return cast


def strings_to_array(where: str, values: object) -> Array:
    """Convert flat_string values (str, or bytes from protobuf) to bytes elements."""
    if not isinstance(values, list):
        raise bad_request(f"{where} must be a list of strings, not {type(values).__name__}")
    out = np.empty(len(values), dtype=object)
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise bad_request(f"{where}[{index}]: {value!r} is not a string")
        out[index] = value.encode()
    return out


def text_elements(where: str, array: Array) -> list[str]:
    """Return BYTES elements as text, for flat_string and str_data.

    Raises:
        GrpsError: 500, an element is not UTF-8 (GRPS strings are text).
    """
    try:
        return [dtypes.as_bytes(value).decode() for value in array.reshape(-1)]
    except UnicodeDecodeError as ex:
        raise GrpsError(
            500,
            f"{where} holds bytes that are not UTF-8 text ({ex.reason} at byte {ex.start}); "
            "GRPS strings carry text only, so ask for bin_data or use a BYTES-safe payload",
        ) from None


__all__ = [
    "FLAT_FIELDS",
    "GRPS_TYPES",
    "MAP_DTYPES",
    "TYPE_OF_FIELD",
    "GrpsType",
    "Kind",
    "MapField",
    "Payload",
    "check_shape",
    "fit_numbers",
    "numbers_to_array",
    "output_type",
    "parse_grps_type",
    "strings_to_array",
    "tensor_from_flat",
    "text_elements",
]
