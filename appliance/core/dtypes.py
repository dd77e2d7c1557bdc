"""The one dtype table, and the packed layout of BYTES tensors.

The appliance names element types as the Open Inference Protocol does
(BOOL, UINT8 ... FP64, BYTES); every protocol maps its own names onto these in
its codec. Numeric tensors are little-endian, row-major, without padding.

BYTES tensors (strings) are packed as, per element in row-major order::

    +----------------------+------------------+
    | length: uint32, LE   | length raw bytes |
    +----------------------+------------------+

which is the layout of KServe's binary tensor extension, so such a tensor can
go from the wire to a ring and back without re-encoding.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt


class DType(enum.StrEnum):
    """Element types, named as the Open Inference Protocol names them."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"


# NOTE: explicit little-endian numpy types, so a view over a ring reads the
# wire layout on any host.
_NUMPY: dict[DType, np.dtype[np.generic]] = {
    DType.BOOL: np.dtype("?"),
    DType.UINT8: np.dtype("<u1"),
    DType.UINT16: np.dtype("<u2"),
    DType.UINT32: np.dtype("<u4"),
    DType.UINT64: np.dtype("<u8"),
    DType.INT8: np.dtype("<i1"),
    DType.INT16: np.dtype("<i2"),
    DType.INT32: np.dtype("<i4"),
    DType.INT64: np.dtype("<i8"),
    DType.FP16: np.dtype("<f2"),
    DType.FP32: np.dtype("<f4"),
    DType.FP64: np.dtype("<f8"),
    DType.BYTES: np.dtype(object),
}

_FROM_NUMPY: dict[str, DType] = {
    "b": DType.BOOL,
    "u1": DType.UINT8,
    "u2": DType.UINT16,
    "u4": DType.UINT32,
    "u8": DType.UINT64,
    "i1": DType.INT8,
    "i2": DType.INT16,
    "i4": DType.INT32,
    "i8": DType.INT64,
    "f2": DType.FP16,
    "f4": DType.FP32,
    "f8": DType.FP64,
}

# Wire codes used in descriptors; stable, never reordered.
DTYPE_CODES: dict[DType, int] = {dtype: index for index, dtype in enumerate(DType)}
DTYPES_BY_CODE: dict[int, DType] = {index: dtype for dtype, index in DTYPE_CODES.items()}

_LENGTH = struct.Struct("<I")


def to_numpy(dtype: DType) -> np.dtype[np.generic]:
    """Return the numpy dtype that holds elements of ``dtype``."""
    return _NUMPY[dtype]


def item_size(dtype: DType) -> int:
    """Return the bytes per element, or 0 for the variable-size BYTES."""
    return 0 if dtype is DType.BYTES else _NUMPY[dtype].itemsize


_SEEN: dict[np.dtype[np.generic], DType] = {}


def from_numpy(dtype: np.dtype[np.generic]) -> DType:
    """Return the appliance dtype for a numpy dtype.

    Raises:
        ValueError: numpy dtype has no counterpart (complex, datetime, ...).
    """
    known = _SEEN.get(dtype)
    if known is None:
        known = _SEEN[dtype] = _from_numpy(dtype)
    return known


def _from_numpy(dtype: np.dtype[np.generic]) -> DType:
    if dtype.kind in "OSUa":
        return DType.BYTES
    if dtype.kind == "b":
        return DType.BOOL
    key = f"{dtype.kind}{dtype.itemsize}"
    try:
        return _FROM_NUMPY[key]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no appliance element type") from None


_BY_NAME: dict[str, DType] = {d.value: d for d in DType}


def parse_dtype(name: object, *, loose: bool = False) -> DType:
    """Parse a datatype name as KServe spells it: ``"FP32"``.

    ``loose`` also takes any case, and Triton's config spellings
    (``TYPE_FP32``, ``STRING`` for BYTES), as model config files use them.

    Raises:
        ValueError: not one of the appliance's datatypes; the message lists them.
    """
    if not isinstance(name, str):
        raise ValueError(f"datatype must be a string, got {name!r}")
    key = name
    if loose:
        key = name.upper().removeprefix("TYPE_")
        key = "BYTES" if key == "STRING" else key
    # PERF: a dict lookup; the Enum's call costs more, on every tensor of every request.
    found = _BY_NAME.get(key)
    if found is not None:
        return found
    try:
        return DType(key)
    except ValueError:
        allowed = ", ".join(d.value for d in DType)
        raise ValueError(f"unsupported datatype {name!r}; expected one of {allowed}") from None


def element_count(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def packed_size(elements: Iterable[bytes]) -> int:
    """Return the packed BYTES size of ``elements``."""
    return sum(4 + len(element) for element in elements)


def as_bytes(element: object) -> bytes:
    """Return one BYTES element as bytes (str is UTF-8 encoded)."""
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode()
    if isinstance(element, bytearray | memoryview | np.bytes_):
        return bytes(element)
    if isinstance(element, np.str_):
        return str(element).encode()
    raise TypeError(f"BYTES element must be bytes or str, not {type(element).__name__}")


def pack_bytes(array: npt.NDArray[np.generic]) -> bytes:
    """Pack the elements of ``array`` (row-major) into the BYTES layout."""
    parts: list[bytes] = []
    for element in array.reshape(-1):
        data = as_bytes(element)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def unpack_bytes(buffer: memoryview | bytes, count: int) -> npt.NDArray[np.object_]:
    """Unpack ``count`` BYTES elements into a 1-D object array of bytes.

    Raises:
        ValueError: the buffer is shorter or longer than ``count`` elements.
    """
    view = memoryview(buffer).cast("B")
    end = len(view)
    if count > end // 4:
        # Checked before allocating: the count comes from a shape a client sent.
        raise ValueError(
            f"BYTES data of {end} bytes cannot hold {count} elements (4 length bytes each)"
        )
    out = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + 4 > end:
            raise ValueError(f"BYTES data ends after {index} of {count} elements")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError(
                f"BYTES element {index} claims {length} bytes but only {end - offset} remain"
            )
        out[index] = bytes(view[offset : offset + length])
        offset += length
    if offset != end:
        raise ValueError(f"BYTES data has {end - offset} bytes after its {count} elements")
    return out
