"""UM-Bridge's shared-memory side channel: vectors in the client's segments.

SPEC: PROTOCOL-FACTS §5.5. A client on the same host creates POSIX
shared-memory segments and sends only their names in the JSON request::

    /TestShMem     umbridge_test_shmem_in_{tid}  ->  umbridge_test_shmem_out_{tid}
                   (one float64 each; the server copies in to out)
    /<Call>ShMem   {shmem_name}_in_{tid}_{i}     input vector i, shmem_size_{i} float64s
                   {shmem_name}_out_{tid}_{j}    output vector j (Evaluate), or _0
                                                 (derivatives); the server writes it

    values are float64 in native byte order; shmem_name is "/umbridge".

SAFETY: the segments belong to the client, which creates and unlinks them,
and may shrink one while a request copies. The server reads and writes each
one with preadv and pwritev, never mmap (core/client_memory.py): a segment
that shrinks mid-request then makes a short read, or a write that finds the
size changed, each an InvalidInput error, where a mapping would kill the
frontend process with SIGBUS. It never unlinks (so no
multiprocessing.shared_memory, whose resource tracker would), and it checks
every size against the segment's real size before touching it. Names are
confined to UM-Bridge's ``umbridge`` prefix, so a request can never reach
the appliance's own rings or any other file under /dev/shm; a FIFO or
anything else not a regular file is refused without waiting on it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.core.client_memory import preadv_all, pwritev_all
from appliance.protocols.umbridge.codec import (
    Interface,
    Vector,
    check_count,
    check_length,
)
from appliance.protocols.umbridge.errors import invalid_input

SHM_DIR = "/dev/shm"
_BASE = re.compile(r"/?(umbridge[A-Za-z0-9_]{0,64})")
_TID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ITEM = np.dtype(np.float64)  # native order, as the client writes it


@dataclass(frozen=True, slots=True)
class Channel:
    """The segments one ShMem request names."""

    base: str
    tid: str

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> Channel:
        """Read ``shmem_name`` and ``tid``.

        Raises:
            UmBridgeError: InvalidInput, a name outside UM-Bridge's namespace.
        """
        name = request.get("shmem_name")
        match = _BASE.fullmatch(name) if isinstance(name, str) else None
        if match is None:
            raise invalid_input(
                f"'shmem_name' must be UM-Bridge's segment prefix such as \"/umbridge\" "
                f"(letters, digits, _), got {name!r}"
            )
        return cls(match.group(1), read_tid(request))

    def read_inputs(self, request: Mapping[str, Any], iface: Interface) -> list[Vector]:
        """Read the input vectors from ``{base}_in_{tid}_{i}``.

        Raises:
            UmBridgeError: InvalidInput, wrong count or sizes, missing segments.
        """
        count = request.get("shmem_num_inputs")
        if type(count) is not int:
            raise invalid_input(f"'shmem_num_inputs' must be an integer, got {count!r}")
        check_count(iface, count)
        sizes = []
        for i, (spec, expected) in enumerate(zip(iface.inputs, iface.input_sizes, strict=True)):
            size = request.get(f"shmem_size_{i}")
            if type(size) is not int or size < 0:
                raise invalid_input(f"'shmem_size_{i}' must be a count of float64s, got {size!r}")
            check_length(f"model {iface.name} input vector {i} ({spec.name})", size, expected)
            sizes.append(size)
        return [read_segment(f"{self.base}_in_{self.tid}_{i}", n) for i, n in enumerate(sizes)]

    def write_outputs(self, vectors: Sequence[Vector]) -> None:
        """Write output vector j into ``{base}_out_{tid}_{j}``."""
        for j, vector in enumerate(vectors):
            write_segment(f"{self.base}_out_{self.tid}_{j}", vector)


def read_tid(request: Mapping[str, Any]) -> str:
    tid = request.get("tid")
    if type(tid) is int and tid >= 0:
        tid = str(tid)
    if not isinstance(tid, str) or _TID.fullmatch(tid) is None:
        raise invalid_input(f"'tid' must be the client's thread id (letters, digits), got {tid!r}")
    return tid


def probe(request: Mapping[str, Any]) -> float | None:
    """Answer /TestShMem: copy the test value in to out; None if that fails."""
    try:
        tid = read_tid(request)
        value = read_segment(f"umbridge_test_shmem_in_{tid}", 1)
        write_segment(f"umbridge_test_shmem_out_{tid}", value)
    except Exception:
        # SPEC: PROTOCOL-FACTS §5.5 — a failed probe answers {}, and the
        # client falls back to plain HTTP.
        return None
    return float(value[0])


def read_segment(name: str, count: int) -> Vector:
    """Return a private copy of the first ``count`` float64s of a segment.

    Raises:
        UmBridgeError: InvalidInput, the segment is missing or too small.
    """
    if count == 0:
        # SPEC: PROTOCOL-FACTS §5.5 — the client creates no segment for an empty vector.
        return np.empty(0, dtype=_ITEM)
    nbytes = count * _ITEM.itemsize
    vector = np.empty(count, dtype=_ITEM)
    fd, _ = _open(name, os.O_RDONLY, nbytes)
    try:
        got = preadv_all(fd, vector.data.cast("B"), 0)
        size = os.fstat(fd).st_size
    except OSError as ex:
        raise invalid_input(
            f"shared-memory segment /{name} cannot be read ({ex.strerror})"
        ) from None
    finally:
        os.close(fd)
    if got < nbytes:
        raise invalid_input(
            f"shared-memory segment /{name} shrank to {size} bytes while it was read; "
            f"the request needs {nbytes}"
        )
    return vector


def write_segment(name: str, vector: Vector) -> None:
    """Write a float64 vector at the start of a segment.

    Raises:
        UmBridgeError: InvalidInput, the segment is missing or too small, or
            changed size while it was written.
    """
    data = np.ascontiguousarray(vector, dtype=_ITEM)
    if not data.size:
        return
    fd, before = _open(name, os.O_RDWR, data.nbytes)
    try:
        pwritev_all(fd, data.data.cast("B"), 0)
        after = os.fstat(fd).st_size
    except OSError as ex:
        raise invalid_input(
            f"shared-memory segment /{name} cannot be written ({ex.strerror})"
        ) from None
    finally:
        os.close(fd)
    if after != before:
        # A write past a shrunken end grows the file back: the client's
        # output is incomplete, and it should hear so.
        raise invalid_input(
            f"shared-memory segment /{name} changed size while it was written "
            f"({before} bytes before, {after} after); the request needs {data.nbytes}"
        )


def _open(name: str, mode: int, nbytes: int) -> tuple[int, int]:
    """Open a segment for one copy; return the descriptor and the size it has."""
    path = os.path.join(SHM_DIR, name)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for its other end.
        fd = os.open(path, mode | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as ex:
        raise invalid_input(
            f"shared-memory segment /{name} cannot be opened ({ex.strerror}); "
            "the client creates it before the request"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise invalid_input(f"/{name} is not a shared-memory segment (a regular file)")
    if info.st_size < nbytes:
        os.close(fd)
        raise invalid_input(
            f"shared-memory segment /{name} holds {info.st_size} bytes, fewer than the "
            f"{nbytes} bytes ({nbytes // _ITEM.itemsize} float64) the request needs"
        )
    return fd, info.st_size
