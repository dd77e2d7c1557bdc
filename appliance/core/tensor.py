"""Tensor specs (what a model declares) and tensors (what crosses processes).

A :class:`Tensor` is either a numeric numpy array, or a BYTES tensor held
packed (see :mod:`appliance.core.dtypes`) or as an object array. Tensors that
come back from a model worker are read-only views into its response ring:
they stay valid until the result that holds them is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from appliance.core import dtypes
from appliance.core.dtypes import DType

Array = npt.NDArray[np.generic]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A declared input or output: name, dtype and shape (-1 = any size).

    ``optional``: an input a request may leave out (Triton's ``optional``);
    the model then gets no array of that name.
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    optional: bool = False

    def matches_shape(self, shape: Sequence[int]) -> bool:
        declared = self.shape
        if len(shape) != len(declared):
            return False
        # PERF: a plain loop; this runs for every input of every request.
        for want, got in zip(declared, shape):  # noqa: B905, SIM110 (same lengths; no genexpr)
            if want != got and want != -1:
                return False
        return True

    def fixed_size(self) -> int | None:
        """Return the element count if no dimension is free, else None."""
        if any(dim < 0 for dim in self.shape):
            return None
        return dtypes.element_count(self.shape)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.dtype.value, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> TensorSpec:
        shape = data["shape"]
        assert isinstance(shape, list)
        dtype, optional = DType(str(data["datatype"])), bool(data.get("optional", False))
        return cls(str(data["name"]), dtype, tuple(int(d) for d in shape), optional)


def spec(name: str, dtype: str | DType, shape: Sequence[int], optional: bool = False) -> TensorSpec:
    """Build a TensorSpec; a shorthand for model declarations."""
    return TensorSpec(name, DType(dtype), tuple(int(d) for d in shape), optional)


class Tensor:
    """A tensor's dtype, shape and data, numeric or BYTES.

    Args:
        dtype: the element type.
        shape: the dimensions.
        data: a numpy array (numeric, or an object array for BYTES), or for
            BYTES the packed buffer (4-byte LE length + bytes per element).
    """

    __slots__ = ("_array", "_packed", "dtype", "shape")

    def __init__(
        self,
        dtype: DType,
        shape: Sequence[int],
        data: Array | memoryview | bytes,
    ) -> None:
        self.dtype = dtype
        # PERF: shapes from numpy are already tuples of ints.
        self.shape = shape if type(shape) is tuple else tuple(int(d) for d in shape)
        self._array: Array | None = None
        self._packed: memoryview | None = None
        if isinstance(data, np.ndarray):
            self._array = data
        else:
            if dtype is not DType.BYTES:
                data = np.frombuffer(data, dtype=dtypes.to_numpy(dtype)).reshape(self.shape)
                self._array = data
            else:
                self._packed = memoryview(data).cast("B")

    @classmethod
    def from_array(cls, array: object) -> Tensor:
        """Wrap an array-like; str/bytes elements make a BYTES tensor.

        Raises:
            ValueError: the array's element type has no appliance dtype.
        """
        arr = np.asarray(array)
        dtype = dtypes.from_numpy(arr.dtype)
        if dtype is DType.BYTES and arr.dtype != object:
            arr = arr.astype(object)
        elif dtype is not DType.BYTES and arr.dtype != dtypes.to_numpy(dtype):
            arr = arr.astype(dtypes.to_numpy(dtype))
        return cls(dtype, arr.shape, arr)

    @property
    def element_count(self) -> int:
        return dtypes.element_count(self.shape)

    @property
    def nbytes(self) -> int:
        """Return the size of the tensor's data as stored in a ring."""
        if self.dtype is not DType.BYTES:
            return self.element_count * dtypes.item_size(self.dtype)
        return len(self.packed())

    def packed(self) -> memoryview:
        """Return a BYTES tensor's packed data (packing it once if needed)."""
        if self._packed is None:
            assert self._array is not None
            self._packed = memoryview(dtypes.pack_bytes(self._array))
        return self._packed

    def raw(self) -> memoryview:
        """Return the data as stored in a ring: raw LE bytes, or packed BYTES."""
        if self.dtype is DType.BYTES:
            return self.packed()
        array = self.array()
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return array.reshape(-1).view(np.uint8).data

    def array(self) -> Array:
        """Return the data as a numpy array (object array of bytes for BYTES).

        Raises:
            ValueError: packed BYTES data does not hold exactly the shape's
                element count.
        """
        if self._array is None:
            assert self._packed is not None
            flat = dtypes.unpack_bytes(self._packed, self.element_count)
            self._array = flat.reshape(self.shape)
        return self._array

    def __repr__(self) -> str:
        return f"Tensor({self.dtype.value}, {list(self.shape)})"
