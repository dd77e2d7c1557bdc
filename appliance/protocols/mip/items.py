"""MIP items <-> rows of the model's tensors.

A *row* is one batch element's value for one input or output: a numpy array
of the tensor's shape without its leading batch dimension (BYTES rows are
object arrays of ``bytes``). Requests map items onto rows; replies map rows
back onto items (DESIGN.md "Models"):

=======  ===========================  ==========================  ===============
item     numeric input                BYTES input                 generic model
=======  ===========================  ==========================  ===============
TEXT     the text parsed as JSON      one element, the text       one element
JSON     nested list, exact dtype     string or nested strings    one element
IMAGE    pixels (image-like shapes)   one element, the file       one element
TENSOR   its dtype must match         BYTES TENSOR                as sent
=======  ===========================  ==========================  ===============

TENSOR is our own item type (4). Its data, header fields big-endian like the
rest of MIP, tensor data little-endian like the appliance's rings::

    offset   size      field
    0        1         dtype code (u8), see TENSOR_DTYPES
    1        1         ndim (u8), 0..32
    2        2         reserved (u16), 0
    4        4 x ndim  dims (u32 each), outermost first
    4+4n     rest      data: row-major little-endian elements; for BYTES,
                       per element a u32 little-endian length then the bytes

This module is pure; its errors are :class:`MipError` (SHAPE for items that
do not fit the model, INTERNAL for outputs that cannot be sent back).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import TensorSpec
from appliance.protocols.mip import image
from appliance.protocols.mip.codec import ErrorCode, Item, ItemType, MipError, Piece

Array = npt.NDArray[Any]

# The numbering of Triton's model_config DataType (TYPE_BOOL = 1 ... TYPE_STRING
# = 13), so a Triton user recognises it; 0 stays invalid.
TENSOR_DTYPES: dict[int, DType] = {
    1: DType.BOOL,
    2: DType.UINT8,
    3: DType.UINT16,
    4: DType.UINT32,
    5: DType.UINT64,
    6: DType.INT8,
    7: DType.INT16,
    8: DType.INT32,
    9: DType.INT64,
    10: DType.FP16,
    11: DType.FP32,
    12: DType.FP64,
    13: DType.BYTES,
}
TENSOR_CODES: dict[DType, int] = {dtype: code for code, dtype in TENSOR_DTYPES.items()}
TENSOR_HEADER = struct.Struct("!BBH")
MAX_NDIM = 32
MAX_ELEMENTS = 1 << 59


def shape_error(message: str) -> MipError:
    return MipError(ErrorCode.SHAPE, message)


# -- TENSOR items ---------------------------------------------------------------


def decode_tensor(data: memoryview, where: str) -> Array:
    """Decode a TENSOR item's data; numeric data stays a view of ``data``.

    Raises:
        MipError: SHAPE when the layout is broken.
    """
    if len(data) < TENSOR_HEADER.size:
        raise shape_error(f"{where}: a TENSOR item needs at least 4 bytes, got {len(data)}")
    code, ndim, reserved = TENSOR_HEADER.unpack_from(data)
    dtype = TENSOR_DTYPES.get(code)
    if dtype is None:
        raise shape_error(f"{where}: TENSOR dtype code {code} is unknown (1..13)")
    if reserved or ndim > MAX_NDIM:
        raise shape_error(
            f"{where}: TENSOR header has reserved {reserved} (must be 0) and ndim {ndim} "
            f"(at most {MAX_NDIM})"
        )
    start = TENSOR_HEADER.size + 4 * ndim
    if len(data) < start:
        raise shape_error(f"{where}: TENSOR item ends inside its {ndim} dims")
    shape = struct.unpack_from(f"!{ndim}L", data, TENSOR_HEADER.size)
    body = data[start:]
    count = math.prod(shape)
    if math.prod(max(dim, 1) for dim in shape) > MAX_ELEMENTS:
        # numpy refuses such a shape even when a zero dim leaves it empty.
        raise shape_error(
            f"{where}: TENSOR shape {list(shape)} is too big: the product of its dims "
            f"(zeros aside) passes {MAX_ELEMENTS}"
        )
    if dtype is DType.BYTES:
        return _unpack_bytes(body, count, shape, where)
    size = dtypes.item_size(dtype)
    if len(body) != count * size:
        raise shape_error(
            f"{where}: TENSOR {dtype.value} {list(shape)} needs {count * size} bytes of "
            f"data, the item has {len(body)}"
        )
    return np.frombuffer(body, dtype=dtypes.to_numpy(dtype)).reshape(shape)


def _unpack_bytes(body: memoryview, count: int, shape: Sequence[int], where: str) -> Array:
    # Every element takes at least its 4-byte length: refuse a huge claimed
    # count before allocating for it.
    if count * 4 > len(body):
        raise shape_error(
            f"{where}: TENSOR BYTES {list(shape)} needs at least {count * 4} bytes, "
            f"the item has {len(body)}"
        )
    try:
        return dtypes.unpack_bytes(body, count).reshape(shape)
    except ValueError as ex:
        raise shape_error(f"{where}: TENSOR BYTES data: {ex}") from None


def encode_tensor(row: Array) -> list[Piece]:
    """Return a TENSOR item's data for ``row`` as pieces (no copy of numeric data)."""
    dtype = dtypes.from_numpy(row.dtype)
    shape = row.shape
    head = TENSOR_HEADER.pack(TENSOR_CODES[dtype], len(shape), 0)
    dims = struct.pack(f"!{len(shape)}L", *shape)
    if dtype is DType.BYTES:
        return [head, dims, dtypes.pack_bytes(row)]
    wanted = dtypes.to_numpy(dtype)
    if row.dtype != wanted or not row.flags.c_contiguous:
        row = np.ascontiguousarray(row, dtype=wanted)
    return [head, dims, row.reshape(-1).view(np.uint8).data]


# -- requests: item -> row ---------------------------------------------------------


def decode_row(item: Item, spec: TensorSpec | None, row_shape: Sequence[int], where: str) -> Array:
    """Return the row an item gives the input ``spec`` (None: a generic model).

    Raises:
        MipError: SHAPE when the item does not fit the input.
    """
    if item.type is ItemType.TENSOR:
        row = decode_tensor(item.data, where)
        if spec is not None and dtypes.from_numpy(row.dtype) is not spec.dtype:
            raise shape_error(
                f"{where}: TENSOR item has dtype {dtypes.from_numpy(row.dtype).value}, the "
                f"input is {spec.dtype.value}"
            )
    elif spec is None:
        row = _element(bytes(item.data))
    elif spec.dtype is DType.BYTES:
        row = _bytes_row(item, where)
    elif item.type is ItemType.IMAGE:
        row = image.decode_pixels(bytes(item.data), row_shape, spec.dtype, where)
    else:
        row = _numeric(_parse_json(item.data, where), spec.dtype, where)
    return row if spec is None else fit_shape(row, row_shape, where)


def _element(data: bytes) -> Array:
    row = np.empty((), dtype=object)
    row[()] = data
    return row


def _parse_json(data: memoryview, where: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as ex:
        raise shape_error(f"{where}: the item is not valid JSON: {ex}") from None


def _bytes_row(item: Item, where: str) -> Array:
    if item.type is not ItemType.JSON:
        return _element(bytes(item.data))
    value = _parse_json(item.data, where)
    try:
        strings = np.array(value, dtype=object)
    except ValueError:
        raise shape_error(f"{where}: the JSON value is a ragged nested list") from None
    flat = strings.reshape(-1)
    if not all(isinstance(element, str) for element in flat):
        raise shape_error(f"{where}: the input holds BYTES; the JSON value must be strings")
    encoded = np.empty(flat.shape, dtype=object)
    for index, element in enumerate(flat):
        encoded[index] = element.encode()
    return encoded.reshape(strings.shape)


def _numeric(value: Any, dtype: DType, where: str) -> Array:
    """Convert a parsed JSON value to ``dtype``, refusing inexact conversions."""
    try:
        array = np.array(value)
    except (ValueError, OverflowError):
        raise shape_error(f"{where}: the JSON value is a ragged nested list") from None
    kind = array.dtype.kind
    target = dtypes.to_numpy(dtype)
    if kind not in "biuf" or (kind == "b") != (dtype is DType.BOOL):
        wanted = "true/false" if dtype is DType.BOOL else "numbers"
        raise shape_error(f"{where}: the input is {dtype.value}; the JSON value must hold {wanted}")
    if target.kind in "iu" and kind == "f":
        # numpy reads integers mixed with floats, or with values past
        # int64, as float64, rounding those beyond 2**53: convert exactly.
        array = _exact_integers(value, array.shape, dtype, where)
    if target.kind in "iu":
        _check_integers(array, target, dtype, where)
    # An overflow is reported below as a SHAPE error, not warned about.
    with np.errstate(over="ignore", invalid="ignore"):
        converted = array.astype(target)
    if target.kind == "f":
        _check_floats(array, converted, dtype, where)
    return converted


def _exact_integers(value: Any, shape: tuple[int, ...], dtype: DType, where: str) -> Array:
    flat: list[int] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, float) and item.is_integer():
            flat.append(int(item))
        elif type(item) is int:
            flat.append(item)
        else:
            raise shape_error(
                f"{where}: the input is {dtype.value}; the JSON value holds non-integers"
            )
    info = np.iinfo(cast(Any, dtypes.to_numpy(dtype)))
    if flat and (min(flat) < info.min or max(flat) > info.max):
        raise shape_error(
            f"{where}: the input is {dtype.value}; JSON values {min(flat)}..{max(flat)} are "
            f"outside {info.min}..{info.max}"
        )
    return np.array(flat, dtype=dtypes.to_numpy(dtype)).reshape(shape)


def _check_integers(array: Array, target: np.dtype[Any], dtype: DType, where: str) -> None:
    info = np.iinfo(target)
    if array.size == 0:
        return
    if array.dtype.kind == "f" and not np.all(np.isfinite(array) & (np.floor(array) == array)):
        raise shape_error(f"{where}: the input is {dtype.value}; the JSON value holds non-integers")
    low, high = array.min(), array.max()
    if low < info.min or high > info.max:
        raise shape_error(
            f"{where}: the input is {dtype.value}; JSON values {low}..{high} are outside "
            f"{info.min}..{info.max}"
        )


def _check_floats(array: Array, converted: Array, dtype: DType, where: str) -> None:
    if array.dtype.kind in "iu" and not np.array_equal(converted.astype(array.dtype), array):
        raise shape_error(f"{where}: the input is {dtype.value}; a JSON integer is not exact in it")
    if array.dtype.kind == "f" and np.any(np.isinf(converted) & np.isfinite(array)):
        raise shape_error(f"{where}: the input is {dtype.value}; a JSON number overflows it")


def fit_shape(row: Array, row_shape: Sequence[int], where: str) -> Array:
    """Return ``row`` in the expected shape (-1 = any size).

    A row whose element count is what a fully fixed shape needs is reshaped
    (a flat JSON list for an 8x8 input); a single element fits any shape
    whose dims are all 1 or -1.

    Raises:
        MipError: SHAPE when it does not fit.
    """
    shape = tuple(row_shape)
    if len(row.shape) == len(shape) and all(
        w in (-1, g) for w, g in zip(shape, row.shape, strict=True)
    ):
        return row
    if -1 not in shape and row.size == math.prod(shape):
        return row.reshape(shape)
    if row.size == 1 and all(dim in (-1, 1) for dim in shape):
        return row.reshape((1,) * len(shape))
    raise shape_error(
        f"{where}: the item holds shape {list(row.shape)}; the input expects "
        f"{list(shape)} per batch element (-1 = any size)"
    )


# -- replies: row -> item ------------------------------------------------------------


def reply_type(request_type: ItemType, row: Array) -> ItemType:
    """The item type a reply row is sent as, given the request's type there.

    The request's type, except that an IMAGE position whose output is not an
    image (not a single BYTES element, not UINT8 pixels) is answered as JSON.
    """
    if request_type is not ItemType.IMAGE:
        return request_type
    if _single_bytes(row) or image.is_pixels(row):
        return ItemType.IMAGE
    return ItemType.JSON


def encode_row(item_type: ItemType, row: Array, verbatim: bool, where: str) -> list[Piece]:
    """Return the data of the reply item for one output row.

    ``verbatim``: a single BYTES element is sent as its bytes even for JSON
    (a generic model echoing the JSON text it was given).

    Raises:
        MipError: INTERNAL when a BYTES output is not UTF-8 where text is needed.
    """
    if item_type is ItemType.TENSOR:
        return encode_tensor(row)
    single = _single_bytes(row)
    if single is not None and (item_type is not ItemType.JSON or verbatim):
        return [single]
    if item_type is ItemType.IMAGE:
        return [image.encode_png(row)]
    if row.dtype == object:
        return [orjson.dumps(_strings(row, where))]
    if row.ndim == 0:
        return [orjson.dumps(row.item())]
    return [orjson.dumps(np.ascontiguousarray(row), option=orjson.OPT_SERIALIZE_NUMPY)]


def _single_bytes(row: Array) -> bytes | None:
    if row.dtype != object or row.size != 1:
        return None
    return dtypes.as_bytes(row.reshape(-1)[0])


def _strings(row: Array, where: str) -> Any:
    try:
        texts = [dtypes.as_bytes(element).decode() for element in row.reshape(-1)]
    except UnicodeDecodeError:
        raise MipError(
            ErrorCode.INTERNAL, f"{where}: holds bytes that are not UTF-8; ask with TENSOR items"
        ) from None
    return np.array(texts, dtype=object).reshape(row.shape).tolist()
