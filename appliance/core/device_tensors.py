"""Tensors that stay in a client's GPU memory: where they are, and views of them.

KServe's CUDA shared memory lets a client name a registered device buffer
(a CUDA IPC handle) for an input or an output. No frontend touches those
bytes: a request carries a :class:`CudaPlace` in its descriptor, and the
model worker opens the handle (appliance/worker/cuda_regions.py), hands its
model a :class:`DeviceArray` over the client's memory when the model runs
on that GPU, or copies the bytes itself when it does not.

In a descriptor a place is ``{"cuda": [region, serial, handle, device,
offset, nbytes]}``: a dict, so that nothing that reads ring places
(``[segment, offset, nbytes]``) mistakes it for one. ``serial`` is the
region's registration number, so a worker never uses a handle opened for an
older region of the same name. In a reply, the same place says that the
worker has written the output there, and the reply carries no bytes for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core.dtypes import DType, to_numpy

CUDA_PLACE = "cuda"
# The method of a request that asks a model worker to open a region (a
# registration's check): its body's "region" is the place, its reply one
# INT64 tensor of this name, the bytes the buffer holds from the offset on.
OPEN_REGION = "open_region"


@dataclass(frozen=True, slots=True)
class CudaPlace:
    """Part of a registered CUDA region: ``nbytes`` at ``offset`` of its buffer."""

    region: str
    serial: int
    handle: str  # base64 of the 64 bytes of a cudaIpcMemHandle_t
    device: int
    offset: int
    nbytes: int

    def to_body(self) -> dict[str, list[Any]]:
        return {
            CUDA_PLACE: [
                self.region,
                self.serial,
                self.handle,
                self.device,
                self.offset,
                self.nbytes,
            ]
        }

    @classmethod
    def from_body(cls, place: Any) -> CudaPlace:
        """Read a place written by :meth:`to_body`.

        Raises:
            ValueError: it is not one.
        """
        try:
            region, serial, handle, device, offset, nbytes = place[CUDA_PLACE]
            made = cls(str(region), int(serial), str(handle), int(device), int(offset), int(nbytes))
        except (KeyError, TypeError, ValueError) as ex:
            raise ValueError(f"{place!r:.120} is not a CUDA place ({ex})") from None
        if made.offset < 0 or made.nbytes < 0 or made.device < 0:
            raise ValueError(f"{place!r:.120} has a negative offset, size or device")
        return made


def is_cuda_place(place: Any) -> bool:
    return type(place) is dict and CUDA_PLACE in place


@dataclass(frozen=True, slots=True)
class DeviceTensor:
    """A request input that lies in a client's CUDA region (see the module docstring)."""

    dtype: DType
    shape: tuple[int, ...]
    place: CudaPlace


class DeviceArray:
    """A C-contiguous array in GPU memory, shown to torch and others by its CUDA array interface.

    Args:
        pointer: the device address of its first byte.
        shape, dtype: as numpy's.
        device: the GPU it is on.
        owner: whatever keeps the memory alive (a torch tensor, an OrtValue).
    """

    __slots__ = ("device", "dtype", "owner", "pointer", "shape")

    def __init__(
        self,
        pointer: int,
        shape: Sequence[int],
        dtype: np.dtype[Any],
        device: int,
        owner: Any = None,
    ) -> None:
        self.pointer = pointer
        self.shape = tuple(int(dim) for dim in shape)
        self.dtype = dtype
        self.device = device
        self.owner = owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # SPEC: numba's CUDA Array Interface, version 3. No stream: the
        # memory is ready when the array is handed over.
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.pointer, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def placeholder(self) -> npt.NDArray[Any]:
        """A read-only host array of this shape and dtype that holds no bytes."""
        return empty_like(self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"DeviceArray({list(self.shape)}, {self.dtype}, cuda:{self.device})"


def on_device(value: Any) -> bool:
    """Return True when ``value`` lives in GPU memory (it has a CUDA array interface)."""
    return hasattr(value, "__cuda_array_interface__")


def device_array(value: Any, device: int) -> DeviceArray:
    """View a model's GPU output (a torch tensor, a CuPy array, ...) as a DeviceArray.

    Raises:
        ValueError: it is not C-contiguous, or its type has no numpy dtype.
    """
    interface = value.__cuda_array_interface__
    shape = tuple(int(dim) for dim in interface["shape"])
    dtype = np.dtype(interface["typestr"])
    strides = interface.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, dtype.itemsize):
        raise ValueError(f"a GPU output of shape {list(shape)} is not C-contiguous")
    return DeviceArray(int(interface["data"][0]), shape, dtype, device, value)


def empty_like(shape: Sequence[int], dtype: np.dtype[Any] | DType) -> npt.NDArray[Any]:
    """A read-only array of ``shape`` whose every element is one shared zero.

    Stands for a tensor whose bytes are elsewhere (in a client's GPU memory):
    its shape and dtype are right, and it costs no memory.
    """
    numpy_dtype = to_numpy(dtype) if isinstance(dtype, DType) else dtype
    array = np.lib.stride_tricks.as_strided(
        np.zeros(1, numpy_dtype), tuple(shape), (0,) * len(shape), writeable=False
    )
    return array


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))
