"""Where a tensor named in a registered region lies, and where an output goes.

A system region's tensor is a :class:`ClientSpan` of the client's segment
(core/client_memory.py), a CUDA region's a :class:`CudaPlace` for the model
worker (core/device_tensors.py). Apart from shm.py, which keeps the
registry: these are the rules for a client's segments and a tensor's
extent, and they hold nothing.

SAFETY: the segments belong to the client, which may truncate, unlink or
replace one at any moment. They are opened with ``os.open`` (never
``multiprocessing.shared_memory``, whose resource tracker may unlink them),
mapped only for the guarded copy (core/client_memory.py), never unlinked or
resized. The appliance's own segments
(``appliance-*``) cannot be named.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from appliance.core.client_memory import ClientSpan
from appliance.core.device_tensors import CudaPlace
from appliance.core.segment import SHM_DIR
from appliance.core.tree import PREFIX
from appliance.errors import BadRequest
from appliance.protocols.kserve.inference import ShmRef
from appliance.protocols.kserve.shm_registry import CudaRegion, Region


@dataclass(frozen=True, slots=True)
class Target:
    """Where one output goes: ``nbytes`` of a region, written by ``write``."""

    nbytes: int
    write: Callable[[memoryview], None]


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


@functools.lru_cache(maxsize=1024)
def segment_file(key: str) -> str:
    """:func:`segment_path` as a string, remembered: a request names its regions' keys
    on every call (pathlib's parsing was a third of a span's making).

    Raises:
        BadRequest: as :func:`segment_path` (not remembered).
    """
    return str(segment_path(key))


def open_segment(key: str) -> tuple[int, os.stat_result]:
    """Open a client's segment; return its descriptor (the caller closes it) and its stat.

    Raises:
        BadRequest: as :func:`segment_path`, it does not open, or it is no regular file.
    """
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


def check_extent(ref: ShmRef, what: str, byte_size: int, region: str) -> None:
    """Refuse (BadRequest) a tensor that runs past ``byte_size`` bytes of ``region``."""
    if ref.offset + ref.byte_size > byte_size:
        raise BadRequest(
            f"{what}: shared_memory_offset {ref.offset} + shared_memory_byte_size "
            f"{ref.byte_size} exceed the {byte_size} bytes of {region}"
        )


def segment_span(
    region: Region, ref: ShmRef, what: str, mapped: memoryview | None = None
) -> ClientSpan:
    """Return the bytes of a tensor in a system region, as a span of its segment.

    Nothing is opened here: the span's copies find a segment that is gone,
    replaced (by device and inode) or too small. ``mapped``: the segment's
    mapping (:func:`appliance.core.client_memory.map_segment`), if it has one.

    Raises:
        BadRequest: the tensor runs past the region.
    """
    check_extent(ref, what, region.byte_size, f"region {region.name!r}")
    return ClientSpan(
        segment_file(region.key),
        region.offset + ref.offset,
        ref.byte_size,
        region.offset + region.byte_size,
        f"shared memory key {region.key!r} of region {region.name!r}",
        what,
        (region.device, region.inode),
        f"; register region {region.name!r} again",
        mapped,
    )


def cuda_place(region: CudaRegion, ref: ShmRef) -> CudaPlace:
    """Return where the model worker finds a tensor in a CUDA region (its extent checked)."""
    return CudaPlace(
        region.name,
        region.serial,
        region.raw_handle,
        region.device_id,
        ref.offset,
        ref.byte_size,
    )
