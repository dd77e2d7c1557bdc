"""A model worker's side of KServe CUDA shared memory: the client's GPU buffers it has open.

A request may name inputs and outputs in a client's registered CUDA
regions (appliance/core/device_tensors.py). The worker opens each region's
IPC handle once, in the primary context of its GPU (the context torch and
ONNX Runtime use), and keeps it open until the region is unregistered: the
registry (kserve-shm.json in the tree's directory, written by the
frontends) is read again whenever it changed, at the housekeeping tick and
before any handle is opened.

What the model gets for an input there:

- a :class:`DeviceArray` over the client's memory, no copy, when the model
  takes GPU inputs (``Model.device_inputs``) on that very GPU;
- otherwise a host copy, made here (a model on the CPU, or on another GPU).

Outputs are written into the client's region: device to device from a
model's GPU output, host to device from a host one.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from appliance.core import cuda
from appliance.core.device_tensors import CudaPlace, DeviceArray, device_array, on_device
from appliance.core.dtypes import DType, to_numpy
from appliance.errors import BadRequest, ModelFailed

log = logging.getLogger("appliance.worker")

# Written by appliance/protocols/kserve/shm_registry.py; read here, never written.
REGISTRY_FILE = "kserve-shm.json"


@dataclass(slots=True)
class _Opened:
    """One IPC handle open in this process, and the registrations that name it."""

    device: int
    pointer: int
    allocated: int  # bytes from pointer to the end of the client's allocation
    users: set[tuple[str, int]]


class CudaRegions:
    """The client regions this worker has open, by (name, serial).

    Args:
        directory: the tree's private directory, where the registry is.
    """

    def __init__(self, directory: Path) -> None:
        self._path = directory / REGISTRY_FILE
        self._seen: tuple[int, int, int] | None = None
        self._current: dict[str, int] = {}  # region name -> serial, as registered
        # A handle opens once per process: two regions over one buffer share it.
        self._handles: dict[tuple[str, int], _Opened] = {}  # (handle, device) ->
        self._opened: dict[tuple[str, int], _Opened] = {}  # (region, serial) ->

    def open(self, place: CudaPlace) -> int:
        """Open ``place``'s region if it is not yet; return the bytes it holds from its offset.

        Raises:
            BadRequest: the region was unregistered, or its handle does not open.
        """
        opened = self._open(place)
        return opened.allocated - place.offset

    def array(self, dtype: DType, shape: tuple[int, ...], place: CudaPlace) -> DeviceArray:
        """A view of an input in the client's GPU memory (no copy).

        Raises:
            BadRequest: as :meth:`open`, or the tensor does not fit its place.
        """
        opened = self._open(place)
        _check_size(dtype, shape, place)
        return DeviceArray(
            opened.pointer + place.offset, shape, np.dtype(to_numpy(dtype)), place.device
        )

    def to_host(self, dtype: DType, shape: tuple[int, ...], place: CudaPlace) -> npt.NDArray[Any]:
        """A host copy of an input in the client's GPU memory.

        Raises:
            BadRequest: as :meth:`array`, or the copy failed.
        """
        device = self.array(dtype, shape, place)
        host: npt.NDArray[Any] = np.empty(shape, to_numpy(dtype))
        self._copy(
            place,
            lambda driver: driver.to_host(
                place.device, host.ctypes.data, device.pointer, host.nbytes
            ),
        )
        host.flags.writeable = False  # as inputs in the request ring are
        return host

    def write(self, name: str, value: Any, place: CudaPlace) -> None:
        """Write output ``name`` (a host array or a GPU one) into the client's region.

        Raises:
            BadRequest: it needs more bytes than ``place`` holds, or the copy failed.
        """
        opened = self._open(place)
        nbytes = int(value.nbytes)
        if nbytes > place.nbytes:
            raise BadRequest(
                f"output {name} needs {nbytes} bytes but its shared_memory_byte_size is "
                f"{place.nbytes} (region {place.region!r})"
            )
        pointer = opened.pointer + place.offset
        if on_device(value):
            source = device_array(value, place.device)
            self._copy(
                place,
                lambda driver: driver.device_to_device(
                    place.device, pointer, source.pointer, nbytes
                ),
            )
            return
        host = np.ascontiguousarray(value)
        self._copy(
            place, lambda driver: driver.to_device(place.device, pointer, host.ctypes.data, nbytes)
        )

    def sweep(self) -> None:
        """Close the handles of regions unregistered (or registered anew) since they were opened."""
        try:
            info = os.stat(self._path)
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            seen = (0, 0, 0)
        if seen == self._seen:
            return
        self._seen = seen
        try:
            data = orjson.loads(self._path.read_bytes())
            self._current = {
                name: int(fields["serial"]) for name, fields in data.get("cuda", {}).items()
            }
        except FileNotFoundError:
            self._current = {}
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as ex:
            log.warning("the shared-memory registry %s is unreadable (%s)", self._path, ex)
            return
        for key in [key for key in self._opened if self._current.get(key[0]) != key[1]]:
            opened = self._opened.pop(key)
            opened.users.discard(key)
            if not opened.users:
                self._close(opened)

    def close(self) -> None:
        for opened in self._handles.values():
            self._close(opened)
        self._handles.clear()
        self._opened.clear()

    def _open(self, place: CudaPlace) -> _Opened:
        key = (place.region, place.serial)
        opened = self._opened.get(key)
        if opened is not None:
            return opened
        # A handle stays open here until its region goes from the registry:
        # close what went before opening anew (a client that freed a buffer
        # and registered a new one may be given the same handle).
        self.sweep()
        if self._current.get(place.region) != place.serial:
            raise BadRequest(
                f"CUDA shared memory region {place.region!r} was unregistered before the "
                "model could read it; register it again"
            )
        opened = self._handles.get((place.handle, place.device))
        if opened is None:
            opened = self._open_handle(place)
        if place.offset + place.nbytes > opened.allocated:
            if not opened.users:
                self._close(opened)
            raise BadRequest(
                f"CUDA shared memory region {place.region!r}: its device buffer holds "
                f"{opened.allocated} bytes, fewer than offset {place.offset} + {place.nbytes}"
            )
        opened.users.add(key)
        self._handles[(place.handle, place.device)] = opened
        self._opened[key] = opened
        return opened

    def _open_handle(self, place: CudaPlace) -> _Opened:
        try:
            driver = cuda.driver()
            pointer, allocated = driver.open(base64.b64decode(place.handle), place.device)
        except (cuda.CudaError, ValueError) as ex:
            raise BadRequest(
                f"CUDA shared memory region {place.region!r} does not open on GPU "
                f"{place.device} ({ex}); was its buffer freed? register it again"
            ) from None
        log.info("opened CUDA shared memory region %r on GPU %d", place.region, place.device)
        return _Opened(place.device, pointer, allocated, set())

    def _copy(self, place: CudaPlace, copy: Any) -> None:
        try:
            copy(cuda.driver())
        except cuda.CudaError as ex:
            raise BadRequest(
                f"copy with CUDA shared memory region {place.region!r} failed ({ex})"
            ) from None

    def _close(self, opened: _Opened) -> None:
        for key, held in list(self._handles.items()):
            if held is opened:
                del self._handles[key]
        with contextlib.suppress(cuda.CudaError):
            cuda.driver().close(opened.device, opened.pointer)


def download(array: DeviceArray) -> npt.NDArray[Any]:
    """Copy a GPU array (a model's output) to a new host array.

    Raises:
        ModelFailed: the copy failed.
    """
    host: npt.NDArray[Any] = np.empty(array.shape, array.dtype)
    try:
        cuda.driver().to_host(array.device, host.ctypes.data, array.pointer, host.nbytes)
    except cuda.CudaError as ex:
        raise ModelFailed(f"copying a GPU output to the host failed ({ex})") from None
    return host


def _check_size(dtype: DType, shape: tuple[int, ...], place: CudaPlace) -> None:
    count = 1
    for dim in shape:
        count *= dim
    needed = count * np.dtype(to_numpy(dtype)).itemsize
    if needed != place.nbytes:
        raise BadRequest(
            f"a {dtype.value} tensor of shape {list(shape)} takes {needed} bytes, but its "
            f"shared_memory_byte_size is {place.nbytes} (region {place.region!r})"
        )
