"""Triton's shared-memory extensions, system and CUDA: the table of the host's regions.

SPEC: PROTOCOL-FACTS §2.4. A client creates a POSIX segment (key
``/input_simple`` is the file ``/dev/shm/input_simple``), registers it under
a region name over either transport, then names the region in inference
requests. Any frontend process of the host may serve those: a register over
HTTP lands in one gunicorn worker, the inference over gRPC in another
process. So the registry is one small JSON file in the tree's private
directory, changed under an exclusive ``flock`` and replaced atomically by
rename; each process caches it by (inode, mtime).

SAFETY: the segments belong to the client, which may truncate, unlink or
replace one at any moment, also while a request copies. A plain mapping
would kill the process that touches a page past a shrunken end with SIGBUS.
A request's tensor is a :class:`ClientSpan` (inputs copied straight into the
request ring, outputs straight from the worker's response ring; see
core/client_memory.py): where the compiled request path runs, each
process's table maps a region's segment on its first use and keeps the
mapping (and the descriptor it holds) while the region is registered, as
Triton keeps its own; the span copies with the
guarded copy, which a shrinking file cannot kill; elsewhere it copies with
preadv/pwritev on a descriptor opened for that copy, and nothing stays open
between requests. Either way, a segment that shrank, vanished or is another
file than the one registered (by device and inode) makes the request fail
with a BadRequest that names the region. A mapping goes when the table
finds its region unregistered (or registered again), within
``SWEEP_INTERVAL_S`` (shm_mappings.py), and the last request that copies
through it has finished: no copy runs on an unmapped page. Segments are opened
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

Here is the table each frontend process answers the extension's calls with;
beside it, shm_registry.py holds the registry file, shm_places.py the rules
for a client's segments and a tensor's extent, shm_mappings.py the segments
mapped for guarded copies, shm_cuda_handles.py the handles a frontend opens
itself, shm_sweeper.py the thread that lets go of both.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from appliance.core import cuda
from appliance.core.client_memory import ClientSpan
from appliance.core.device_tensors import CudaPlace
from appliance.errors import ApplianceError, BadRequest, Unsupported
from appliance.protocols.kserve.errors import RegionNotFound
from appliance.protocols.kserve.inference import ShmRef
from appliance.protocols.kserve.shm_cuda_handles import OpenedHandle, OpenedHandles
from appliance.protocols.kserve.shm_mappings import MappedSegments
from appliance.protocols.kserve.shm_places import (
    Target,
    check_extent,
    cuda_place,
    open_segment,
    segment_span,
)
from appliance.protocols.kserve.shm_registry import CudaRegion, Region, RegistryView
from appliance.protocols.kserve.shm_sweeper import Sweeper

# The most spans a table keeps made (each a few hundred bytes).
MAX_SPANS = 1024

# Opens a CUDA region in a model worker on its GPU: the bytes its buffer
# holds, None when no model runs there (ModelClient.open_region).
Opener = Callable[[CudaPlace], int | None]


class RegionTable(RegistryView):
    """This process's view of the registry (and, copying CUDA regions here, their handles).

    Args:
        directory: the tree's private directory (``client.tree.dir``).
        cuda_copies: who copies CUDA regions' bytes, "model_worker" or "frontend".
        opener: checks a CUDA registration in a model worker (model_worker copies).
    """

    def __init__(
        self, directory: Path, cuda_copies: str = "model_worker", opener: Opener | None = None
    ) -> None:
        super().__init__(directory)
        self._in_frontend = cuda_copies == "frontend"
        self._opener = opener
        self._lock = threading.Lock()
        # One thread lets go of both kinds of what this process holds.
        sweeper = Sweeper(self._lock, self._refresh, self._holding, "kserve-shm-sweeper")
        self._handles = OpenedHandles(sweeper)
        self._mapped = MappedSegments(sweeper)
        # Spans through a mapping, made once: a client names the same places
        # request after request. Valid while the registry is unchanged.
        self._spans: dict[tuple[str, int, int, str], ClientSpan] = {}

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
        fd, info = open_segment(key)
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
            self._handles.keep(name, OpenedHandle(serial, device_id, pointer))

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

    def unregister(self, name: str | None, kind: str = "regions") -> None:
        """Forget one region (or every one when ``name`` is None); unknown names are fine.

        ``kind`` is "regions" for system regions, "cuda" for CUDA ones.
        """
        self._remove(kind, name)
        with self._lock:
            self._refresh()

    def cuda_status(self, name: str | None) -> list[CudaRegion]:
        """Return the registered CUDA regions, or the one named.

        Raises:
            RegionNotFound: ``name`` is not registered as a CUDA region.
        """
        with self._lock:
            self._refresh()
            if name is None:
                return sorted(self._cuda.values(), key=lambda region: region.name)
            region = self._cuda.get(name)
        if region is None:
            raise RegionNotFound(f"no CUDA shared memory region named {name!r} is registered")
        return [region]

    def status(self, name: str | None) -> list[Region]:
        """Return the registered regions, or the one named.

        Raises:
            RegionNotFound: ``name`` is not registered.
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
            RegionNotFound: no region of that name is registered.
            BadRequest: the tensor runs past the region.
        """
        with self._lock:
            self._refresh()
            return self._span(ref, what)

    def close(self) -> None:
        """Close the CUDA handles this process opened, and drop its mappings (at exit)."""
        with self._lock:
            self._handles.close_all()
            self._spans.clear()
            self._mapped.clear()

    def _place(self, ref: ShmRef, what: str) -> ClientSpan | CudaPlace | OpenedHandle:
        """Return a system region's span of a tensor, a CUDA one's place or its opened handle.

        Raises:
            BadRequest: as :meth:`span`, or the CUDA handle no longer opens.
        """
        with self._lock:
            self._refresh()
            region = self._cuda.get(ref.region)
            if region is None:
                return self._span(ref, what)
            check_extent(ref, what, region.byte_size, f"CUDA region {region.name!r}")
            if not self._in_frontend:
                return cuda_place(region, ref)
            return self._handles.get(region, what)

    def _span(self, ref: ShmRef, what: str) -> ClientSpan:
        """:meth:`span`, under the lock and after a refresh."""
        key = (ref.region, ref.offset, ref.byte_size, what)
        span = self._spans.get(key)
        if span is not None:
            return span
        region = self._region(ref.region)
        span = segment_span(region, ref, what, self._mapped.get(region))
        if span.mapped is not None:
            if len(self._spans) >= MAX_SPANS:
                self._spans.clear()
            self._spans[key] = span
        return span

    def _copy(
        self,
        what: str,
        opened: OpenedHandle,
        ref: ShmRef,
        host: npt.NDArray[np.uint8],
        to_device: bool,
    ) -> None:
        """Copy ``host`` to a tensor's place in a CUDA region, or from it into ``host``.

        SAFETY: under the lock, so that no unregister closes the handle mid-copy.
        """
        with self._lock:
            self._handles.copy(what, opened, ref, host, to_device)

    # -- keeping in step with the file -------------------------------------------

    def _holding(self) -> bool:
        """Whether this process holds anything for a region (the caller holds the lock)."""
        return self._handles.holding() or self._mapped.holding()

    def _refresh(self) -> None:
        """Reload the registry if another process changed it; close what went.

        A mapping dropped here is unmapped when the last span holding it goes.
        What is held follows the registry only, so an unchanged one needs no pruning.
        """
        if self._reload():
            self._spans.clear()
            self._handles.prune(self._cuda)
            self._mapped.prune(self._regions)
