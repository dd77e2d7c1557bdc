"""Triton's shared-memory extensions, system and CUDA: the host-wide region registry.

SPEC: PROTOCOL-FACTS §2.4. A client creates a POSIX segment (key
``/input_simple`` is the file ``/dev/shm/input_simple``), registers it under
a region name over either transport, then names the region in inference
requests. Any frontend process of the host may serve those: a register over
HTTP lands in one gunicorn worker, the inference over gRPC in another
process. So the registry is one small JSON file in the tree's private
directory, changed under an exclusive ``flock`` and replaced atomically by
rename; each process caches it by (inode, mtime).

SAFETY: the segments belong to the client, which may truncate, unlink or
replace one at any moment, also while a request copies. They are never
mapped: a mapping kills the process that touches a page past a shrunken end
with SIGBUS. A request's tensor is a :class:`ClientSpan`, whose bytes are
copied with preadv/pwritev on a descriptor opened for that copy (inputs
straight into the request ring, outputs straight from the worker's response
ring; see core/client_memory.py), and a segment that shrank, vanished or is
another file than the one registered (by device and inode) makes the request
fail with a BadRequest that names the region. Nothing stays open between
requests, so unregistering needs no unmapping anywhere. Segments are opened
with ``os.open`` (never ``multiprocessing.shared_memory``, whose resource
tracker may unlink them), never unlinked or resized. The appliance's own
segments (``appliance-*``) cannot be registered.

CUDA regions (SPEC: PROTOCOL-FACTS §2.4, the same namespace as system ones)
are a client's device buffers, registered as CUDA IPC handles. No frontend
opens them: a request names its tensors' places (core/device_tensors.py),
and the model worker that serves it opens the handle on its GPU, feeds its
model from it and writes the outputs into it (worker/cuda_regions.py).
Registration asks a model worker on that GPU to open the handle, so a bad
handle or a short buffer is refused then, as Triton does; where no model
runs on that GPU, the first request that uses the region finds out.

``shm.cuda_copies = "frontend"`` (the way before) has each frontend process
open the handle on first use, with a CUDA context of its own, and copy
through host memory; unregistering closes it within ``SWEEP_INTERVAL_S``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from appliance.core import cuda
from appliance.core.client_memory import ClientSpan
from appliance.core.device_tensors import CudaPlace
from appliance.core.segment import SHM_DIR
from appliance.core.tree import PREFIX
from appliance.errors import ApplianceError, BadRequest, Unsupported
from appliance.protocols.kserve.errors import RegionExists
from appliance.protocols.kserve.inference import ShmRef

# The model workers read it too (worker/cuda_regions.py).
REGISTRY_FILE = "kserve-shm.json"
LOCK_FILE = "kserve-shm.lock"
SWEEP_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class Region:
    """A registered region: part of a client's segment."""

    name: str
    key: str
    offset: int
    byte_size: int
    device: int
    inode: int
    serial: int

    def status(self) -> dict[str, Any]:
        """Return the region as the status call reports it."""
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass(frozen=True, slots=True)
class CudaRegion:
    """A registered CUDA region: a client's device buffer, by its IPC handle."""

    name: str
    raw_handle: str  # base64 of the handle's 64 bytes
    device_id: int
    byte_size: int
    serial: int

    def status(self) -> dict[str, Any]:
        """Return the region as the status call reports it."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


@dataclass(frozen=True, slots=True)
class Target:
    """Where one output goes: ``nbytes`` of a region, written by ``write``."""

    nbytes: int
    write: Callable[[memoryview], None]


@dataclass(slots=True)
class _Opened:
    """A CUDA region's handle, opened in this process."""

    serial: int
    device: int
    pointer: int


def segment_path(key: str) -> Path:
    """Return the /dev/shm file of a client's key.

    Raises:
        BadRequest: the key is empty, holds a path, or names an appliance segment.
    """
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise BadRequest(
            f"shared memory key {key!r} is not a valid POSIX name such as '/my_region'"
        )
    if name.startswith(PREFIX):
        raise BadRequest(f"shared memory key {key!r} names one of the appliance's own segments")
    return SHM_DIR / name


def _open_segment(key: str) -> tuple[int, os.stat_result]:
    path = segment_path(key)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for its other end.
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as ex:
        raise BadRequest(f"unable to open shared memory key {key!r}: {ex.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise BadRequest(f"shared memory key {key!r} is not a shared-memory segment")
    return fd, info


# Opens a CUDA region in a model worker on its GPU: the bytes its buffer
# holds, None when no model runs there (ModelClient.open_region).
Opener = Callable[[CudaPlace], int | None]


class RegionTable:
    """This process's view of the registry (and, copying CUDA regions here, their handles).

    Args:
        directory: the tree's private directory (``client.tree.dir``).
        cuda_copies: who copies CUDA regions' bytes, "model_worker" or "frontend".
        opener: checks a CUDA registration in a model worker (model_worker copies).
    """

    def __init__(
        self, directory: Path, cuda_copies: str = "model_worker", opener: Opener | None = None
    ) -> None:
        self._in_frontend = cuda_copies == "frontend"
        self._opener = opener
        self._path = directory / REGISTRY_FILE
        self._lock_path = directory / LOCK_FILE
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._regions: dict[str, Region] = {}
        self._cuda: dict[str, CudaRegion] = {}
        self._opened: dict[str, _Opened] = {}
        self._sweeper: threading.Thread | None = None

    # -- the registry ---------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes at ``offset`` of the segment ``key`` as ``name``.

        Raises:
            BadRequest: no such segment, or it is smaller than offset + byte_size.
            RegionExists: ``name`` is already registered.
        """
        if not name:
            raise BadRequest("a shared memory region needs a name")
        if offset < 0 or byte_size <= 0:
            raise BadRequest(
                f"region {name!r}: offset must be >= 0 and byte_size > 0 "
                f"(got {offset} and {byte_size})"
            )
        fd, info = _open_segment(key)
        os.close(fd)
        if info.st_size < offset + byte_size:
            raise BadRequest(
                f"shared memory key {key!r} holds {info.st_size} bytes, fewer than offset "
                f"{offset} + byte_size {byte_size} of region {name!r}"
            )
        self._add(
            "regions",
            name,
            lambda serial: Region(name, key, offset, byte_size, info.st_dev, info.st_ino, serial),
        )

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register a client's device buffer, by its CUDA IPC handle, as ``name``.

        The handle is opened by a model worker on that GPU (or here, when
        this process copies), which checks that it is one and that the
        buffer holds ``byte_size`` bytes; other processes open it on first use.

        Raises:
            Unsupported: no usable CUDA driver on this host.
            BadRequest: not a handle, no such GPU, or a buffer under byte_size.
            RegionExists: ``name`` is already registered (either kind).
        """
        what = f"cannot register CUDA shared memory region {name!r}"
        if not name:
            raise BadRequest("a shared memory region needs a name")
        if byte_size <= 0:
            raise BadRequest(f"{what}: byte_size must be > 0 (got {byte_size})")
        try:
            driver = cuda.driver()
        except cuda.CudaError as ex:
            raise Unsupported(
                f"{what}: this server is CPU-only ({ex}); use system shared memory"
            ) from None
        if len(raw_handle) != cuda.IPC_HANDLE_SIZE:
            raise BadRequest(
                f"{what}: raw_handle must be the {cuda.IPC_HANDLE_SIZE} bytes of a "
                f"cudaIpcMemHandle_t, got {len(raw_handle)}"
            )
        try:
            # cuInit and a count make no CUDA context: this process stays off the GPU.
            count = driver.device_count()
        except cuda.CudaError as ex:
            raise Unsupported(f"{what}: the CUDA driver does not answer ({ex})") from None
        if not 0 <= device_id < count:
            raise BadRequest(
                f"{what}: device_id {device_id} is not one of this host's {count} GPU(s)"
            )
        if not self._in_frontend:
            self._register_for_workers(name, raw_handle, device_id, byte_size)
            return
        try:
            pointer, allocated = driver.open(raw_handle, device_id)
        except cuda.CudaError as ex:
            raise BadRequest(
                f"{what}: the handle does not open on GPU {device_id} ({ex})"
            ) from None
        try:
            if allocated < byte_size:
                raise BadRequest(
                    f"{what}: its device buffer holds {allocated} bytes, fewer than "
                    f"byte_size {byte_size}"
                )
            encoded = base64.b64encode(raw_handle).decode()
            serial = self._add(
                "cuda", name, lambda serial: CudaRegion(name, encoded, device_id, byte_size, serial)
            ).serial
        except BaseException:
            driver.close(device_id, pointer)
            raise
        with self._lock:
            self._refresh()  # closes a handle opened for an older region of this name
            self._opened[name] = _Opened(serial, device_id, pointer)
            self._start_sweeper()

    def _register_for_workers(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        """Register a CUDA region, then have a model worker on its GPU open it.

        Raises:
            BadRequest: the handle does not open there, or its buffer is too small.
            RegionExists: ``name`` is already registered (either kind).
        """
        what = f"cannot register CUDA shared memory region {name!r}"
        encoded = base64.b64encode(raw_handle).decode()
        serial = self._add(
            "cuda", name, lambda serial: CudaRegion(name, encoded, device_id, byte_size, serial)
        ).serial
        try:
            allocated = None
            if self._opener is not None:
                allocated = self._opener(CudaPlace(name, serial, encoded, device_id, 0, 0))
            if allocated is not None and allocated < byte_size:
                raise BadRequest(
                    f"{what}: its device buffer holds {allocated} bytes, fewer than "
                    f"byte_size {byte_size}"
                )
        except ApplianceError as ex:
            self._drop("cuda", name, serial)
            if isinstance(ex, BadRequest) and ex.message.startswith(what):
                raise
            raise BadRequest(f"{what}: {ex.message}") from None
        except BaseException:
            self._drop("cuda", name, serial)
            raise

    def _drop(self, kind: str, name: str, serial: int) -> None:
        """Forget region ``name`` of ``kind`` if it is still the one numbered ``serial``."""
        with self._exclusive() as data:
            if data[kind].get(name, {}).get("serial") == serial:
                del data[kind][name]

    def _add(
        self, kind: str, name: str, make: Callable[[int], Region | CudaRegion]
    ) -> Region | CudaRegion:
        """Write a new region of ``kind`` ("regions" or "cuda") under the next serial.

        Raises:
            RegionExists: ``name`` is taken by a region of either kind.
        """
        with self._exclusive() as data:
            _check_free(data, name)
            data["serial"] += 1
            region = make(data["serial"])
            data[kind][name] = asdict(region)
        return region

    def unregister(self, name: str | None, kind: str = "regions") -> None:
        """Forget one region (or every one when ``name`` is None); unknown names are fine.

        ``kind`` is "regions" for system regions, "cuda" for CUDA ones.
        """
        with self._exclusive() as data:
            if name is None:
                data[kind].clear()
            else:
                data[kind].pop(name, None)
        with self._lock:
            self._refresh()

    def cuda_status(self, name: str | None) -> list[CudaRegion]:
        """Return the registered CUDA regions, or the one named.

        Raises:
            BadRequest: ``name`` is not registered as a CUDA region.
        """
        with self._lock:
            self._refresh()
            if name is None:
                return sorted(self._cuda.values(), key=lambda region: region.name)
            region = self._cuda.get(name)
        if region is None:
            raise BadRequest(f"no CUDA shared memory region named {name!r} is registered")
        return [region]

    def status(self, name: str | None) -> list[Region]:
        """Return the registered regions, or the one named.

        Raises:
            BadRequest: ``name`` is not registered.
        """
        with self._lock:
            self._refresh()
            if name is None:
                return sorted(self._regions.values(), key=lambda region: region.name)
            return [self._region(name)]

    # -- the data ---------------------------------------------------------------

    def read(self, ref: ShmRef, what: str) -> ClientSpan | CudaPlace | memoryview:
        """Return where the bytes of an input in a region of either kind are.

        A system region's bytes stay in the client's segment until the model
        client copies them (a span); a CUDA region's are where the model
        worker finds them, or (copied here) a new host buffer.

        Raises:
            BadRequest: as :meth:`span`, or the copy from the device failed.
        """
        place = self._place(ref, what)
        if isinstance(place, ClientSpan | CudaPlace):
            return place
        host = np.empty(ref.byte_size, np.uint8)
        self._copy(what, place, ref, host, to_device=False)
        return host.data

    def target(self, ref: ShmRef, what: str) -> Target | CudaPlace:
        """Return where an output goes in a region of either kind.

        A CUDA place is written by the model worker, a Target here.

        Raises:
            BadRequest: as :meth:`span`, or a system region's segment is
                gone, replaced or too small now (before the model runs).
        """
        place = self._place(ref, what)
        if isinstance(place, CudaPlace):
            return place
        if isinstance(place, ClientSpan):
            place.check()
            return Target(place.nbytes, place.write)
        opened = place

        def to_device(raw: memoryview) -> None:
            self._copy(what, opened, ref, np.frombuffer(raw, np.uint8), to_device=True)

        return Target(ref.byte_size, to_device)

    def span(self, ref: ShmRef, what: str) -> ClientSpan:
        """Return the bytes of a tensor in a system region, as a span of its segment.

        Nothing is opened here: the span's copies find a segment that is
        gone, replaced or too small.

        Raises:
            BadRequest: unknown region, or the tensor runs past the region.
        """
        with self._lock:
            self._refresh()
            return self._span(ref, what)

    def close(self) -> None:
        """Close the CUDA handles this process opened (at exit)."""
        with self._lock:
            for name in list(self._opened):
                self._close(self._opened.pop(name))

    def _place(self, ref: ShmRef, what: str) -> ClientSpan | CudaPlace | _Opened:
        """Return a system region's span of a tensor, a CUDA one's place or its opened handle.

        Raises:
            BadRequest: as :meth:`span`, or the CUDA handle no longer opens.
        """
        with self._lock:
            self._refresh()
            region = self._cuda.get(ref.region)
            if region is None:
                return self._span(ref, what)
            _check_extent(ref, what, region.byte_size, f"CUDA region {region.name!r}")
            if not self._in_frontend:
                return CudaPlace(
                    region.name,
                    region.serial,
                    region.raw_handle,
                    region.device_id,
                    ref.offset,
                    ref.byte_size,
                )
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
            fresh = _Opened(region.serial, region.device_id, pointer)
            self._opened[region.name] = fresh
            self._start_sweeper()
            return fresh

    def _span(self, ref: ShmRef, what: str) -> ClientSpan:
        """:meth:`span`, under the lock and after a refresh."""
        region = self._region(ref.region)
        _check_extent(ref, what, region.byte_size, f"region {region.name!r}")
        return ClientSpan(
            str(segment_path(region.key)),
            region.offset + ref.offset,
            ref.byte_size,
            region.offset + region.byte_size,
            f"shared memory key {region.key!r} of region {region.name!r}",
            what,
            (region.device, region.inode),
            f"; register region {region.name!r} again",
        )

    def _copy(
        self, what: str, opened: _Opened, ref: ShmRef, host: npt.NDArray[np.uint8], to_device: bool
    ) -> None:
        """Copy ``host`` to a tensor's place in a CUDA region, or from it into ``host``.

        SAFETY: under the lock, so that no unregister closes the handle mid-copy.
        """
        with self._lock:
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

    def _close(self, opened: _Opened) -> None:
        with contextlib.suppress(cuda.CudaError):
            cuda.driver().close(opened.device, opened.pointer)

    def _region(self, name: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise BadRequest(
                f"no system shared memory region named {name!r} is registered; register it first"
            )
        return region

    # -- keeping in step with the file -------------------------------------------

    def _refresh(self) -> None:
        """Reload the registry if another process changed it; close what went."""
        try:
            info = os.stat(self._path)
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            seen = (0, 0, 0)
        if seen != self._seen:
            data = _read(self._path)
            self._regions = {name: Region(**fields) for name, fields in data["regions"].items()}
            self._cuda = {name: CudaRegion(**fields) for name, fields in data["cuda"].items()}
            self._seen = seen
        for name, opened in list(self._opened.items()):
            known = self._cuda.get(name)
            if known is None or known.serial != opened.serial:
                del self._opened[name]
                self._close(opened)

    def _start_sweeper(self) -> None:
        if self._sweeper is None or not self._sweeper.is_alive():
            self._sweeper = threading.Thread(
                target=self._sweep, name="kserve-shm-sweeper", daemon=True
            )
            self._sweeper.start()

    def _sweep(self) -> None:
        """Close CUDA handles of regions other processes unregistered, while any are open."""
        while True:
            time.sleep(SWEEP_INTERVAL_S)
            with self._lock:
                self._refresh()
                if not self._opened:
                    self._sweeper = None
                    return

    @contextlib.contextmanager
    def _exclusive(self) -> Any:
        """Yield the registry for a change, under the lock; write it back after."""
        with open(self._lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = _read(self._path)
            yield data
            temp = self._path.with_name(f".{REGISTRY_FILE}.{os.getpid()}.tmp")
            temp.write_bytes(orjson.dumps(data))
            temp.replace(self._path)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        data = {}
    data.setdefault("regions", {})
    data.setdefault("cuda", {})
    data.setdefault("serial", 0)
    return dict(data)


def _check_extent(ref: ShmRef, what: str, byte_size: int, region: str) -> None:
    """Refuse (BadRequest) a tensor that runs past ``byte_size`` bytes of ``region``."""
    if ref.offset + ref.byte_size > byte_size:
        raise BadRequest(
            f"{what}: shared_memory_offset {ref.offset} + shared_memory_byte_size "
            f"{ref.byte_size} exceed the {byte_size} bytes of {region}"
        )


def _check_free(data: dict[str, Any], name: str) -> None:
    """Refuse (RegionExists) a name either kind holds: they share one namespace."""
    for kind, label in (("regions", "system"), ("cuda", "CUDA")):
        if name in data[kind]:
            raise RegionExists(
                f"shared memory region {name!r} is already registered (as a {label} "
                "region); unregister it first"
            )
