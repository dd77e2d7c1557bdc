"""One shared-memory segment: a plain file under /dev/shm mapped with mmap.

Why not ``multiprocessing.shared_memory``: on Python 3.11 every attach
registers the segment with the resource tracker, which unlinks it when an
attaching process exits. Plain files have no tracker; ownership is ours.

Lifecycle words follow the stdlib: ``close()`` drops this process's mapping,
``unlink()`` removes the name, and only the owner (the creator) unlinks.
Names are ``appliance-<tree>-...`` so that a master can sweep the segments of
its own tree at exit and those of dead trees at start.

Every segment is backed when it is created (``posix_fallocate``): on a full
/dev/shm (a container's 64 MiB default) creating it fails with
:class:`~appliance.errors.ShmExhausted`, where a file only sized by
``ftruncate`` would kill its first writer with SIGBUS at the first page that
finds no room.
"""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from appliance.errors import ShmExhausted

SHM_DIR = Path("/dev/shm")
PAGE = mmap.PAGESIZE
MiB = 1 << 20
# posix_fallocate's answers for "no room": the filesystem is full, or the
# memory cgroup would not charge the pages.
_NO_ROOM = (errno.ENOSPC, errno.ENOMEM, errno.EFBIG)


@dataclass(frozen=True, slots=True)
class Space:
    """The shared-memory filesystem's size and free bytes, now."""

    total: int
    free: int

    @classmethod
    def now(cls) -> Space:
        stat = os.statvfs(SHM_DIR)
        return cls(stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize)


def no_room(size: int, reason: str) -> ShmExhausted:
    """The error for a segment of ``size`` bytes that /dev/shm has no room for."""
    space = Space.now()
    return ShmExhausted(
        f"shared memory is full: {SHM_DIR} has {mib(space.free)} free of {mib(space.total)}, "
        f"{mib(size)} more needed ({reason}); free space there or give it more (a "
        "container's --shm-size)"
    )


def held_by(prefix: str) -> int:
    """Bytes /dev/shm holds for the files whose names start with ``prefix``."""
    total = 0
    for path in SHM_DIR.glob(f"{prefix}*"):
        try:
            total += path.stat().st_blocks * 512
        except FileNotFoundError:
            continue  # unlinked meanwhile
    return total


def mib(nbytes: int) -> str:
    """Bytes for a message a user reads ("64 KiB", "2.4 MiB", "64 MiB")."""
    if nbytes < MiB:
        return f"{nbytes >> 10} KiB"
    value = nbytes / MiB
    return f"{value:.0f} MiB" if value >= 10 or value == int(value) else f"{value:.1f} MiB"


class Segment:
    """A mapped /dev/shm file.

    Use :meth:`create` (owner, read-write) or :meth:`attach` (reader,
    read-only unless ``writable``); do not call the constructor directly.
    """

    __slots__ = ("_map", "name", "owner", "size")

    def __init__(self, name: str, size: int, mapping: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._map: mmap.mmap | None = mapping

    @classmethod
    def create(cls, name: str, size: int, prefault: bool = True) -> Segment:
        """Create a new segment of ``size`` bytes, mode 0600.

        Args:
            name: file name under /dev/shm; must not exist yet.
            size: bytes; rounded up to whole pages.
            prefault: touch every page now, so requests never pay first-touch
                faults (about ten page copies each on this machine kind).

        Raises:
            ShmExhausted: /dev/shm has no room for ``size`` bytes.
            OSError: the name exists.
        """
        size = max(PAGE, -(-size // PAGE) * PAGE)
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException as ex:
            os.close(fd)
            path.unlink(missing_ok=True)
            if isinstance(ex, OSError) and ex.errno in _NO_ROOM:
                raise no_room(size, ex.strerror or str(ex)) from None
            raise
        os.close(fd)
        segment = cls(name, size, mapping, owner=True)
        if prefault:
            np.frombuffer(mapping, dtype=np.uint8)[::PAGE] = 0
        return segment

    @classmethod
    def create_shrinking(cls, name: str, size: int, floor: int) -> Segment:
        """Create a segment of ``size`` bytes, or the largest of its half, quarter,
        ... down to ``floor`` that /dev/shm has room for.

        Raises:
            ShmExhausted: not even ``floor`` bytes fit.
        """
        while True:
            try:
                return cls.create(name, size)
            except ShmExhausted:
                if size <= floor:
                    raise
                size = max(floor, size // 2)

    @classmethod
    def attach(cls, name: str, writable: bool = False, prefault: bool = True) -> Segment:
        """Map an existing segment.

        Args:
            name: file name under /dev/shm.
            writable: map read-write; readers of tensors map read-only so
                that no model can scribble on another process's ring.
            prefault: touch every page of this mapping once now.

        Raises:
            FileNotFoundError: no such segment.
        """
        flags = os.O_RDWR if writable else os.O_RDONLY
        fd = os.open(SHM_DIR / name, flags)
        try:
            size = os.fstat(fd).st_size
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        finally:
            os.close(fd)
        if prefault and size:
            # SAFETY: a read touch maps the page without changing it.
            int(np.frombuffer(mapping, dtype=np.uint8)[::PAGE].sum())
        return cls(name, size, mapping, owner=False)

    @property
    def buffer(self) -> mmap.mmap:
        if self._map is None:
            raise ValueError(f"segment {self.name} is closed")
        return self._map

    def close(self) -> bool:
        """Drop this process's mapping; return False if views still hold it."""
        if self._map is None:
            return True
        try:
            self._map.close()
        except BufferError:
            return False
        self._map = None
        return True

    def unlink(self) -> None:
        """Remove the segment's name; mappings stay valid until closed."""
        (SHM_DIR / self.name).unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"Segment({self.name!r}, {self.size})"
