"""Memory a client owns: bytes of its files, copied so that no client can fault us.

KServe's system shared memory and UM-Bridge's side channel put tensors in
files under /dev/shm that the client creates and may truncate, unlink or
replace at any moment, also while a request copies. A mapping of such a file
kills the process that touches a page past its new end with SIGBUS, and no
check of the size beforehand closes that window. So client bytes are never
mapped here: they are copied with ``preadv``/``pwritev`` on a descriptor
opened for that one copy, where the kernel reports a file that shrank as a
short count. The destination of a read is where the bytes are going anyway
(a block of the request ring, see :func:`appliance.core.message_tensors.place_tensors`),
so this costs no copy more than a mapping did.

What a client may do to its file mid-request, and what it gets:

- shrink it: a read comes up short, a write finds the size changed;
  either is a :class:`~appliance.errors.BadRequest` naming the region, the
  size the file had and the size the request needs.
- unlink it, or replace it by another file of the same name: the open fails
  or finds another inode than the one registered; BadRequest again.
- shrink it while an output is written: ``pwritev`` past the new end grows
  the file back, up to the end of the region the client registered and no
  further; the size found after the write tells, and the request fails.

A FIFO or anything else that is not a regular file is refused when opened
(``O_NONBLOCK``: opening a FIFO must not wait for a writer), and a symbolic
link is never followed.

Where the compiled request path runs (appliance/native.py), a registered
segment may be mapped after all, once (:func:`map_segment`, kept by its
region's table until the region goes, with the descriptor Python's mmap
holds), and copied with the guarded copy of
appliance/core/_guarded.c: a fault past a shrunken end cuts that copy short
instead of killing the process. pread/pwrite on tmpfs took 2-2.5x memcpy's
time for a 1 MiB tensor, and the frontend's event loop is what does them
(docs/performance.md, "System shared memory over REST"). Each copy still
looks the file up first (gone, replaced, too small: the same errors), and
a shrink mid-copy is the same BadRequest as a short read.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from appliance import native
from appliance.core.dtypes import DType
from appliance.errors import BadRequest

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


_Copy = Callable[[memoryview, memoryview], bool]
_Resident = Callable[[memoryview], bool]


def _guarded() -> tuple[_Copy, _Resident] | tuple[None, None]:
    if not native.compiled():
        return None, None
    try:
        from appliance.core._guarded import copy, resident
    except ImportError:
        return None, None
    return copy, resident


# The guarded copy, None where it is not built or the request path runs as Python.
# RESIDENT: whether every page under a mapped view is in memory. Where one is not
# (a hole the client never wrote, or a page a truncation dropped), a fault through
# the mapping allocates and zeroes it, at 3-20x preadv's or pwritev's cost for
# 1 MiB of holes, so that span copies with those instead.
GUARDED_COPY, RESIDENT = _guarded()


@dataclass(frozen=True, slots=True)
class ClientSpan:
    """``nbytes`` bytes at ``start`` of a client's file, copied on demand.

    Args:
        path: the file.
        start: where the bytes begin in it.
        nbytes: how many.
        needs: the size the file must have (the end of the client's region).
        label: what messages call the file, e.g. "shared memory key '/data'
            of region 'in'".
        what: what the bytes are, e.g. "input INPUT0".
        identity: (st_dev, st_ino) of the file as registered; another file
            found under ``path`` is refused. None takes whatever is there.
        hint: what the client can do about a file that is gone or replaced.
        mapped: the file's first ``needs`` bytes mapped (:func:`map_segment`),
            copied with the guarded copy; None copies with preadv/pwritev.
    """

    path: str
    start: int
    nbytes: int
    needs: int
    label: str
    what: str
    identity: tuple[int, int] | None = None
    hint: str = ""
    mapped: memoryview | None = field(default=None, compare=False, repr=False)

    def read_into(self, destination: memoryview) -> None:
        """Copy the bytes into ``destination`` (``nbytes`` long).

        Raises:
            BadRequest: the file is gone, replaced, or shrank (also mid-copy).
        """
        if self._copied_mapped(destination.cast("B"), reading=True):
            return
        fd, _ = self._open(os.O_RDONLY)
        try:
            try:
                got = preadv_all(fd, destination, self.start)
            except OSError as ex:
                raise BadRequest(
                    f"{self.what}: reading {self.label} failed ({ex.strerror})"
                ) from None
            if got < self.nbytes:
                size = _size(fd)
                raise BadRequest(
                    f"{self.what}: {self.label} shrank to {size} bytes while it was read; "
                    f"the request needs {self.needs}"
                )
        finally:
            os.close(fd)

    def read(self) -> bytearray:
        """Return a private copy of the bytes.

        Raises:
            BadRequest: as :meth:`read_into`.
        """
        data = bytearray(self.nbytes)
        self.read_into(memoryview(data))
        return data

    def write(self, source: memoryview) -> None:
        """Copy ``source`` (at most ``nbytes``) to the span's start.

        Raises:
            BadRequest: the file is gone, replaced, shrank, or changed size
                while it was written (the output is then incomplete).
        """
        if self._copied_mapped(source.cast("B"), reading=False):
            return
        fd, before = self._open(os.O_RDWR)
        try:
            try:
                pwritev_all(fd, source, self.start)
            except OSError as ex:
                raise BadRequest(
                    f"{self.what}: writing to {self.label} failed ({ex.strerror})"
                ) from None
            after = _size(fd)
            if after != before:
                raise BadRequest(
                    f"{self.what}: {self.label} changed size while it was written "
                    f"({before} bytes before, {after} after); the request needs {self.needs}, "
                    "and its output there may be incomplete"
                )
        finally:
            os.close(fd)

    def check(self) -> None:
        """Refuse now a file that is gone, replaced or too small (before a model runs).

        Raises:
            BadRequest: as :meth:`read_into`.
        """
        try:
            info = os.lstat(self.path)
        except OSError as ex:
            raise BadRequest(
                f"{self.what}: {self.label} cannot be opened ({ex.strerror}){self.hint}"
            ) from None
        self._judge(info)

    def _copied_mapped(self, ours: memoryview, reading: bool) -> bool:
        """Copy between ``ours`` and the span's start through the mapping, guarded.

        False, with nothing copied, where the span is not mapped or a page
        under it is not in memory: the caller copies with preadv/pwritev.

        Raises:
            BadRequest: the file is gone, replaced or too small, or shrank
                mid-copy.
        """
        if self.mapped is None or GUARDED_COPY is None or RESIDENT is None:
            return False
        theirs = self.mapped[self.start : self.start + ours.nbytes]
        if not RESIDENT(theirs):
            return False
        self.check()
        if GUARDED_COPY(ours, theirs) if reading else GUARDED_COPY(theirs, ours):
            return True
        verb, lost = (
            ("read", "") if reading else ("written", ", and its output there is incomplete")
        )
        raise BadRequest(
            f"{self.what}: {self.label} shrank to {self._size_now()} while it was {verb}; "
            f"the request needs {self.needs}{lost}"
        )

    def _size_now(self) -> str:
        """The file's size now, in words, for a copy a fault cut short."""
        try:
            return f"{os.lstat(self.path).st_size} bytes"
        except OSError:
            return "nothing (it is gone)"

    def _open(self, mode: int) -> tuple[int, int]:
        """Open the file for one copy; return the descriptor and the size it has.

        Raises:
            BadRequest: it is gone, not a regular file, replaced, or too small.
        """
        try:
            fd = os.open(self.path, mode | _OPEN_FLAGS)
        except OSError as ex:
            raise BadRequest(
                f"{self.what}: {self.label} cannot be opened ({ex.strerror}){self.hint}"
            ) from None
        try:
            info = os.fstat(fd)
            self._judge(info)
        except BaseException:
            os.close(fd)
            raise
        return fd, info.st_size

    def _judge(self, info: os.stat_result) -> None:
        """Refuse a file that is not a regular one, not the one registered, or too small.

        Raises:
            BadRequest: it is.
        """
        problem = _mismatch(info, self.identity, self.needs)
        if problem == "kind":
            raise BadRequest(f"{self.what}: {self.label} is not a shared-memory segment")
        if problem == "identity":
            raise BadRequest(
                f"{self.what}: {self.label} was replaced by another segment of that name{self.hint}"
            )
        if problem == "size":
            raise BadRequest(
                f"{self.what}: {self.label} shrank to {info.st_size} bytes; "
                f"the request needs {self.needs}"
            )


def _mismatch(info: os.stat_result, identity: tuple[int, int] | None, needs: int) -> str | None:
    """What makes ``info`` not the client's registered file of at least ``needs`` bytes.

    "kind" (not a regular file), "identity" (another file than ``identity``,
    when given) or "size"; None when it is that file.
    """
    if not stat.S_ISREG(info.st_mode):
        return "kind"
    if identity is not None and (info.st_dev, info.st_ino) != identity:
        return "identity"
    if info.st_size < needs:
        return "size"
    return None


def map_segment(path: str, needs: int, identity: tuple[int, int]) -> memoryview | None:
    """Map the first ``needs`` bytes of a client's file for guarded copies.

    None where there is no guarded copy, or the file is not the one
    registered (gone, replaced, too small): then the span copies with
    preadv/pwritev, whose errors say what is wrong.
    """
    if GUARDED_COPY is None:
        return None
    try:
        fd = os.open(path, os.O_RDWR | _OPEN_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if _mismatch(info, identity, needs) is not None:
            return None
        # Not MAP_POPULATE: that would allocate every page of a sparse segment the
        # client never wrote; a page is faulted in once, when a copy first touches it.
        return memoryview(mmap.mmap(fd, needs, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
    except (OSError, ValueError):
        # ValueError: mmap checks the size again, and the client may have shrunk
        # the file since the fstat above; the span's own copy then says so.
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ClientTensor:
    """An input whose bytes lie in a client's file, read once into the request ring."""

    dtype: DType
    shape: Sequence[int]
    span: ClientSpan

    @property
    def nbytes(self) -> int:
        return self.span.nbytes


def _size(fd: int) -> int:
    return os.fstat(fd).st_size


def preadv_all(fd: int, destination: memoryview, offset: int) -> int:
    """Read into ``destination`` until it is full or the file ends; return the count.

    Raises:
        OSError: the read failed.
    """
    destination = destination.cast("B")
    total, wanted = 0, destination.nbytes
    while total < wanted:
        got = os.preadv(fd, [destination[total:]], offset + total)
        if got == 0:
            break
        total += got
    return total


def pwritev_all(fd: int, source: memoryview, offset: int) -> None:
    """Write all of ``source`` at ``offset``.

    Raises:
        OSError: the write failed (ENOSPC: a shrunken tmpfs file grows back
            only while memory allows).
    """
    source = source.cast("B")
    total, wanted = 0, source.nbytes
    while total < wanted:
        total += os.pwritev(fd, [source[total:]], offset + total)
