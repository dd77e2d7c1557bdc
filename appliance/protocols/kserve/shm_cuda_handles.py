"""The CUDA handles a frontend process opened itself (``shm.cuda_copies = "frontend"``).

The way before model workers read and wrote CUDA regions: each frontend
process opens a region's IPC handle on first use, with a CUDA context of its
own, and copies through host memory. Apart from shm.py: the handles, which a
sweeper (shm_sweeper.py) closes within ``SWEEP_INTERVAL_S`` of their regions
being unregistered in another process.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from appliance.core import cuda
from appliance.errors import BadRequest
from appliance.protocols.kserve.inference import ShmRef
from appliance.protocols.kserve.shm_registry import CudaRegion
from appliance.protocols.kserve.shm_sweeper import Sweeper


@dataclass(slots=True)
class OpenedHandle:
    """A CUDA region's handle, opened in this process."""

    serial: int
    device: int
    pointer: int


class OpenedHandles:
    """The CUDA handles this process opened, by region name.

    The region table's lock guards them with the registry they follow: every
    method runs with the caller holding it, but the sweeper's thread, which
    takes it.

    Args:
        sweeper: the region table's, started whenever a handle is held.
    """

    def __init__(self, sweeper: Sweeper) -> None:
        self._opened: dict[str, OpenedHandle] = {}
        self._sweeper = sweeper

    def holding(self) -> bool:
        """Whether any handle is open here."""
        return bool(self._opened)

    def keep(self, name: str, opened: OpenedHandle) -> None:
        """Hold the handle registering region ``name`` opened."""
        self._opened[name] = opened
        self._sweeper.start()

    def get(self, region: CudaRegion, what: str) -> OpenedHandle:
        """Return the handle of ``region``, opened here on first use.

        Raises:
            BadRequest: the handle no longer opens.
        """
        opened = self._opened.get(region.name)
        if opened is not None and opened.serial == region.serial:
            return opened
        try:
            handle = base64.b64decode(region.raw_handle)
            pointer, _ = cuda.driver().open(handle, region.device_id)
        except cuda.CudaError as ex:
            raise BadRequest(
                f"{what}: CUDA region {region.name!r} does not open in this process ({ex}); "
                "was its buffer freed? register it again"
            ) from None
        if opened is not None:
            self._close(opened)
        fresh = OpenedHandle(region.serial, region.device_id, pointer)
        self._opened[region.name] = fresh
        self._sweeper.start()
        return fresh

    def copy(
        self,
        what: str,
        opened: OpenedHandle,
        ref: ShmRef,
        host: npt.NDArray[np.uint8],
        to_device: bool,
    ) -> None:
        """Copy ``host`` to a tensor's place in a CUDA region, or from it into ``host``.

        SAFETY: the caller holds the lock, so that no unregister closes the
        handle mid-copy.
        """
        if self._opened.get(ref.region) is not opened:
            raise BadRequest(f"{what}: CUDA region {ref.region!r} was unregistered meanwhile")
        driver, pointer = cuda.driver(), opened.pointer + ref.offset
        try:
            if to_device:
                driver.to_device(opened.device, pointer, host.ctypes.data, host.nbytes)
            else:
                driver.to_host(opened.device, host.ctypes.data, pointer, host.nbytes)
        except cuda.CudaError as ex:
            raise BadRequest(
                f"{what}: copy with CUDA region {ref.region!r} failed ({ex})"
            ) from None

    def prune(self, registered: Mapping[str, CudaRegion]) -> None:
        """Close the handles of regions no longer ``registered`` as they were opened."""
        for name, opened in list(self._opened.items()):
            known = registered.get(name)
            if known is None or known.serial != opened.serial:
                del self._opened[name]
                self._close(opened)

    def close_all(self) -> None:
        """Close every handle (at exit)."""
        for name in list(self._opened):
            self._close(self._opened.pop(name))

    def _close(self, opened: OpenedHandle) -> None:
        with contextlib.suppress(cuda.CudaError):
            cuda.driver().close(opened.device, opened.pointer)
