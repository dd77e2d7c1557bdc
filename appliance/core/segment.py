"""One shared-memory segment: a plain file under /dev/shm mapped with mmap.

Why not ``multiprocessing.shared_memory``: on Python 3.11 every attach
registers the segment with the resource tracker, which unlinks it when an
attaching process exits. Plain files have no tracker; ownership is ours.

Lifecycle words follow the stdlib: ``close()`` drops this process's mapping,
``unlink()`` removes the name, and only the owner (the creator) unlinks.
Names are ``appliance-<tree>-...`` so that a master can sweep the segments of
its own tree at exit and those of dead trees at start.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
PAGE = mmap.PAGESIZE


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
            OSError: the name exists or /dev/shm is full.
        """
        size = max(PAGE, -(-size // PAGE) * PAGE)
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        segment = cls(name, size, mapping, owner=True)
        if prefault:
            np.frombuffer(mapping, dtype=np.uint8)[::PAGE] = 0
        return segment

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
