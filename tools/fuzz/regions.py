"""The client-memory fuzz target: what a local client may do to its shared memory.

An input is a little program, run against a real registry (a RegionTable in
a private directory) and real files under /dev/shm: register a region at
sizes and offsets at and past the edges of its segment, truncate or grow a
segment, unlink it, replace it by another file of the same name, unregister
a region, resolve a request's tensor in a region and copy it then or after
any of the above (a region unregistered or a segment truncated while a
request holds it), and UM-Bridge's reads and writes of its segments. Every
step may fail only with the protocol's own client error (BadRequest,
UmBridgeError InvalidInput): never another exception, never a signal.

Each op is one byte (its number modulo the ops) and the bytes after it are
its arguments; a number argument is one byte that picks an edge (0, 1, a
page, the segment's size and its neighbours, huge values) or, past the
edges, a value of its own. The files and the registry are removed after
every input.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SHM = Path("/dev/shm")
PAGE = 4096
LIMIT = 1 << 16  # the largest segment a program makes
REGIONS = ("a", "b")
OPS = (
    "register",
    "truncate",
    "replace",
    "unlink",
    "unregister",
    "read",
    "write",
    "hold",
    "use",
    "umbridge",
)


class _Program:
    """The bytes of an input, read as ops and their arguments."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise EOFError
        value = self.data[self.at]
        self.at += 1
        return value

    def number(self, size: int) -> int:
        """An edge of ``size`` (a segment's or a region's), or a value of its own."""
        pick = self.byte()
        edges = (
            0,
            1,
            size - 1,
            size,
            size + 1,
            PAGE - 1,
            PAGE,
            PAGE + 1,
            size // 2,
            (1 << 31) - 1,
            1 << 32,
            (1 << 63) - 1,
            (1 << 64) - 1,
        )
        if pick < len(edges):
            return max(0, edges[pick])
        return (pick - len(edges)) * 257 % (LIMIT + 1)


def run(data: bytes) -> None:
    from appliance.errors import BadRequest
    from appliance.protocols.kserve.shm import RegionTable
    from appliance.protocols.umbridge.errors import UmBridgeError

    with _world() as (directory, keys):
        table = RegionTable(directory)
        program = _Program(data)
        held: list[Any] = []
        try:
            while True:
                op = OPS[program.byte() % len(OPS)]
                path = SHM / keys[program.byte() % len(keys)].lstrip("/")
                region = REGIONS[program.byte() % len(REGIONS)]
                with contextlib.suppress(BadRequest, UmBridgeError):
                    _step(op, program, table, path, region, held)
        except EOFError:
            pass
        finally:
            table.close()


def _step(op: str, program: _Program, table: Any, path: Path, region: str, held: list[Any]) -> None:
    """Run one op on the segment at ``path`` and the region named ``region``."""
    from appliance.protocols.kserve.inference import ShmRef

    size = _size(path)
    if op == "register":
        table.register(region, f"/{path.name}", program.number(size), program.number(size))
    elif op == "truncate":
        with contextlib.suppress(FileNotFoundError):
            os.truncate(path, min(program.number(size), LIMIT))
    elif op == "replace":
        path.unlink(missing_ok=True)
        _create(path, min(program.number(size), LIMIT))
    elif op == "unlink":
        path.unlink(missing_ok=True)
    elif op == "unregister":
        table.unregister(region if program.byte() % 4 else None)
    elif op in ("read", "write", "hold"):
        # ShmRef(region, byte_size, offset), as a request names them.
        ref = ShmRef(region, program.number(size), program.number(size))
        if op == "write":
            table.target(ref, "output y").write(memoryview(bytes(ref.byte_size)))
            return
        span = table.span(ref, "input x")
        if op == "read":
            span.read_into(memoryview(bytearray(span.nbytes)))
        else:
            held.append(span)
    elif op == "use" and held:
        span = held.pop(program.byte() % len(held))
        span.read()
        span.write(memoryview(b"\x01" * span.nbytes))
    elif op == "umbridge" and path.name.startswith("umbridge"):
        _umbridge(program, path.name, size)


def _umbridge(program: _Program, name: str, size: int) -> None:
    """UM-Bridge's read or write of a vector at the start of segment ``name``."""
    from appliance.protocols.umbridge import shm as umbridge

    count = program.number(size // 8)
    if count > LIMIT // 8:
        return  # the codec checks counts against the model's sizes first
    if program.byte() % 2:
        umbridge.read_segment(name, count)
    else:
        umbridge.write_segment(name, _floats(count))


def _floats(count: int) -> Any:
    import numpy as np

    return np.ones(count, dtype=np.float64)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _create(path: Path, size: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _world() -> Iterator[tuple[Path, list[str]]]:
    """A registry directory and two client segments, the second UM-Bridge's; then none."""
    directory = Path(tempfile.mkdtemp(prefix="fuzz-regions-"))
    keys = [f"/fuzzshm{os.getpid()}_0", f"/umbridge_fuzz{os.getpid()}_1"]
    for key in keys:
        _create(SHM / key.lstrip("/"), PAGE)
    try:
        yield directory, keys
    finally:
        for key in keys:
            (SHM / key.lstrip("/")).unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)


def _op(name: str, key: int = 0, region: int = 0) -> bytes:
    return bytes([OPS.index(name), key, region])


def seeds() -> list[bytes]:
    """Programs for the issue's cases: edges, truncation before use, unregister while held."""
    size, half, page_plus, past = 3, 8, 7, 4  # edge picks of _Program.number
    register = _op("register") + bytes([0, size])  # the whole segment
    use = _op("use") + bytes([0])
    return [
        register + _op("read") + bytes([size, 0]) + _op("write") + bytes([size, 0]),
        # Sizes and offsets at and past the edges.
        _op("register") + bytes([past, 1]) + _op("register") + bytes([1, size]),
        register + _op("read") + bytes([size, 1]) + _op("read") + bytes([half, half]),
        _op("register") + bytes([page_plus, 0]) + _op("register", 1, 1) + bytes([0, 12]),
        # Truncated (or grown) between registration and use.
        register + _op("truncate") + bytes([half]) + _op("read") + bytes([size, 0]),
        register + _op("truncate") + bytes([0]) + _op("write") + bytes([1, 0]),
        register + _op("truncate") + bytes([page_plus]) + _op("read") + bytes([size, 0]),
        # Replaced or removed after registration.
        register + _op("replace") + bytes([size]) + _op("read") + bytes([1, 0]),
        register + _op("unlink") + _op("write") + bytes([1, 0]),
        # Unregistered (or truncated) while a request holds the region.
        register + _op("hold") + bytes([size, 0]) + _op("unregister") + bytes([1]) + use,
        register + _op("hold") + bytes([size, 0]) + _op("truncate") + bytes([1]) + use,
        register + _op("hold") + bytes([1, 0]) + _op("replace") + bytes([size]) + use,
        # UM-Bridge's segments, read and written at and past their size.
        _op("umbridge", 1) + bytes([size, 1]) + _op("umbridge", 1) + bytes([past, 0]),
        _op("truncate", 1) + bytes([0]) + _op("umbridge", 1) + bytes([1, 1]),
    ]
