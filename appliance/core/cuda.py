"""The few CUDA driver calls that KServe's CUDA shared-memory extension needs.

A client allocates device memory, exports it with ``cudaIpcGetMemHandle``
and registers the 64 handle bytes. The model worker that serves a request
opens the handle in the primary context of that GPU (the one torch and ONNX
Runtime use too), feeds its model from it and writes the outputs into the
client's buffers; a frontend only counts GPUs (``cuInit`` and
``cuDeviceGetCount`` make no context), unless ``cuda_shm_copies`` is
"frontend" (appliance/worker/cuda_regions.py, kserve/shm_cuda_handles.py).

Why the driver API through ctypes: ``libcuda.so.1`` comes with the NVIDIA
driver on every GPU host, whatever CUDA toolkit and Python packages are
installed (torch, CuPy and cuda-python each bring their own runtime), so no
CUDA package is a dependency, and a host without a driver pays nothing: the
library is loaded on the first CUDA registration, and a frontend process
makes a CUDA context only when it first opens a handle.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

IPC_HANDLE_SIZE = 64
# CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: a handle from another GPU still opens.
_LAZY_ENABLE_PEER_ACCESS = 1
_SUCCESS = 0


class CudaError(Exception):
    """A driver call failed, or there is no driver; the message says which."""


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * IPC_HANDLE_SIZE)]


def _fn(lib: ctypes.CDLL, names: tuple[str, ...], argtypes: list[Any]) -> Any:
    """Return the first of ``names`` the driver exports (``_v2`` names come first)."""
    for name in names:
        function = getattr(lib, name, None)
        if function is not None:
            function.argtypes = argtypes
            function.restype = ctypes.c_int
            return function
    raise CudaError(f"the CUDA driver lacks {names[-1]}")


class Driver:
    """This process's CUDA driver: one primary context per GPU, made on first use.

    Raises:
        CudaError: no driver library, or ``cuInit`` failed (no GPU, say).
    """

    def __init__(self) -> None:
        lib = _library()
        u64, ptr, size = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        p_u64, p_int = ctypes.POINTER(u64), ctypes.POINTER(ctypes.c_int)
        self._error_name = _fn(lib, ("cuGetErrorName",), [ctypes.c_int, ctypes.POINTER(ptr)])
        init = _fn(lib, ("cuInit",), [ctypes.c_uint])
        self._count = _fn(lib, ("cuDeviceGetCount",), [p_int])
        self._device = _fn(lib, ("cuDeviceGet",), [p_int, ctypes.c_int])
        self._retain = _fn(lib, ("cuDevicePrimaryCtxRetain",), [ctypes.POINTER(ptr), ctypes.c_int])
        self._set_current = _fn(lib, ("cuCtxSetCurrent",), [ptr])
        self._open = _fn(
            lib, ("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"), [p_u64, _IpcHandle, ctypes.c_uint]
        )
        self._close = _fn(lib, ("cuIpcCloseMemHandle",), [u64])
        self._range = _fn(
            lib,
            ("cuMemGetAddressRange_v2", "cuMemGetAddressRange"),
            [p_u64, ctypes.POINTER(size), u64],
        )
        self._to_host = _fn(lib, ("cuMemcpyDtoH_v2", "cuMemcpyDtoH"), [ptr, u64, size])
        self._to_device = _fn(lib, ("cuMemcpyHtoD_v2", "cuMemcpyHtoD"), [u64, ptr, size])
        self._on_device = _fn(lib, ("cuMemcpyDtoD_v2", "cuMemcpyDtoD"), [u64, u64, size])
        self._synchronize = _fn(lib, ("cuCtxSynchronize",), [])
        self._check(init(0), "cuInit")
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._check(self._count(ctypes.byref(count)), "cuDeviceGetCount")
        return count.value

    def open(self, handle: bytes, device: int) -> tuple[int, int]:
        """Open a client's IPC handle on GPU ``device``; return (pointer, bytes allocated).

        Raises:
            CudaError: the handle does not open here (freed, from a process
                that exited, or not a handle at all).
        """
        self._use(device)
        pointer, base, allocated = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_size_t()
        raw = _IpcHandle.from_buffer_copy(handle)
        self._check(
            self._open(ctypes.byref(pointer), raw, _LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle"
        )
        try:
            self._check(
                self._range(ctypes.byref(base), ctypes.byref(allocated), pointer.value),
                "cuMemGetAddressRange",
            )
        except CudaError:
            self.close(device, pointer.value)
            raise
        return pointer.value, base.value + allocated.value - pointer.value

    def close(self, device: int, pointer: int) -> None:
        self._use(device)
        self._check(self._close(pointer), "cuIpcCloseMemHandle")

    def to_host(self, device: int, host: int, pointer: int, nbytes: int) -> None:
        """Copy ``nbytes`` from device memory at ``pointer`` to host address ``host``."""
        self._use(device)
        self._check(self._to_host(host, pointer, nbytes), "cuMemcpyDtoH")

    def to_device(self, device: int, pointer: int, host: int, nbytes: int) -> None:
        """Copy ``nbytes`` from host address ``host`` to device memory at ``pointer``."""
        self._use(device)
        self._check(self._to_device(pointer, host, nbytes), "cuMemcpyHtoD")

    def device_to_device(self, device: int, pointer: int, source: int, nbytes: int) -> None:
        """Copy ``nbytes`` from device memory at ``source`` to device memory at ``pointer``.

        On the legacy default stream, so it starts after the work queued on
        every blocking stream of the context (a model's kernels). A copy
        between device buffers may return before it is done, and the
        client, in another process, reads the buffer as soon as it has the
        reply: so the context is synchronized before this returns.
        """
        self._use(device)
        self._check(self._on_device(pointer, source, nbytes), "cuMemcpyDtoD")
        self._check(self._synchronize(), "cuCtxSynchronize")

    def _use(self, device: int) -> None:
        """Make GPU ``device``'s primary context current in this thread."""
        with self._lock:
            context = self._contexts.get(device)
            if context is None:
                ordinal, context = ctypes.c_int(), ctypes.c_void_p()
                self._check(self._device(ctypes.byref(ordinal), device), "cuDeviceGet")
                self._check(
                    self._retain(ctypes.byref(context), ordinal.value), "cuDevicePrimaryCtxRetain"
                )
                self._contexts[device] = context
        self._check(self._set_current(context), "cuCtxSetCurrent")

    def _check(self, result: int, call: str) -> None:
        if result != _SUCCESS:
            name = ctypes.c_void_p()
            self._error_name(result, ctypes.byref(name))
            text = ctypes.string_at(name.value).decode() if name.value else f"error {result}"
            raise CudaError(f"{call} failed: {text}")


def _library() -> ctypes.CDLL:
    """Load the driver library (it comes with the NVIDIA driver, not with a toolkit).

    Raises:
        CudaError: this host has none.
    """
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as ex:
        raise CudaError(f"no CUDA driver on this host ({ex})") from None


@functools.cache
def driver() -> Driver:
    """Return this process's driver, loaded once.

    Raises:
        CudaError: as :class:`Driver` (and again on each call: the failure is not cached).
    """
    return Driver()


@functools.cache
def installed() -> bool:
    """Return True when this host has a CUDA driver library (it may still have no GPU)."""
    try:
        _library()
    except CudaError:
        return False
    return True
