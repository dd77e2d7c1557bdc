"""The host-wide registry of client shared-memory regions.

Two RegionTable objects over one directory stand for two frontend processes.
Each test of the tables runs with both ways of copying a client's bytes: the
guarded copy through a mapping (where the compiled request path is built)
and preadv/pwritev (core/client_memory.py).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from appliance.core import client_memory
from appliance.core.device_tensors import CudaPlace
from appliance.errors import BadRequest, Unsupported
from appliance.protocols.kserve.errors import RegionExists
from appliance.protocols.kserve.inference import ShmRef
from appliance.protocols.kserve.shm import RegionTable
from appliance.protocols.kserve.shm_places import Target
from appliance.protocols.kserve.shm_registry import CudaRegion
from appliance.worker.cuda_regions import CudaRegions
from tests.gpu import cuda_driver_missing

TAG = f"ksunit{os.getpid()}"


@pytest.fixture
def segment() -> Iterator[Callable[[str, int], str]]:
    """Create client segments; unlink them afterwards (the client's job)."""
    made: list[Path] = []

    def make(name: str, size: int) -> str:
        path = Path("/dev/shm") / f"{TAG}_{name}"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)
        made.append(path)
        return f"/{path.name}"

    yield make
    for path in made:
        path.unlink(missing_ok=True)


@pytest.fixture(params=["guarded", "pread"])
def copies(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the tables copy: "guarded" (mapped) or "pread" (never mapped)."""
    if request.param == "pread":
        monkeypatch.setattr(client_memory, "GUARDED_COPY", None)
    elif client_memory.GUARDED_COPY is None:
        pytest.skip("the guarded copy is not built here (appliance/native.py)")
    return str(request.param)


@pytest.fixture
def tables(tmp_path: Path, copies: str) -> Iterator[tuple[RegionTable, RegionTable]]:
    first, second = RegionTable(tmp_path), RegionTable(tmp_path)
    yield first, second
    first.close()
    second.close()


def read(table: RegionTable, ref: ShmRef) -> bytes:
    """The bytes of a tensor in a system region, as the model client copies them."""
    return bytes(table.span(ref, "input x").read())


def write(table: RegionTable, ref: ShmRef, data: bytes) -> None:
    target = table.target(ref, "output y")
    assert isinstance(target, Target)
    target.write(memoryview(data))


def test_a_registration_is_seen_by_every_table(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    first, second = tables
    key = segment("data", 256)
    first.register("data", key, 64, 128)
    assert [r.status() for r in second.status(None)] == [
        {"name": "data", "key": key, "offset": 64, "byte_size": 128}
    ]
    write(second, ShmRef("data", 4, 8), b"abcd")
    assert read(first, ShmRef("data", 4, 8)) == b"abcd"
    raw = Path("/dev/shm", key[1:]).read_bytes()
    assert raw[64 + 8 : 64 + 12] == b"abcd"
    destination = bytearray(4)
    first.span(ShmRef("data", 4, 8), "input x").read_into(memoryview(destination))
    assert destination == b"abcd"


def test_unregister_forgets_everywhere_and_never_unlinks(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    first, second = tables
    key = segment("a", 64)
    first.register("a", key, 0, 64)
    first.register("b", segment("b", 64), 0, 64)
    read(second, ShmRef("a", 64))
    first.unregister("a")
    with pytest.raises(BadRequest, match="no system shared memory region named 'a'"):
        second.span(ShmRef("a", 64), "input x")
    assert [r.name for r in second.status(None)] == ["b"]
    first.unregister("unknown")
    second.unregister(None)
    assert first.status(None) == []
    assert Path("/dev/shm", key[1:]).exists()


@pytest.mark.parametrize("copies", ["pread"], indirect=True)
def test_a_segment_is_never_mapped_nor_held_open(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    """Copying with pread/pwrite, nothing of a client's segment stays in this process
    between copies."""
    first, second = tables
    key = segment("a", 64)
    first.register("a", key, 0, 64)
    span = second.span(ShmRef("a", 64), "input x")
    write(second, ShmRef("a", 8), b"12345678")
    assert read(first, ShmRef("a", 8)) == b"12345678"
    path = f"/dev/shm/{key[1:]}"
    assert path not in Path("/proc/self/maps").read_text()
    opened = [os.readlink(f) for f in Path("/proc/self/fd").iterdir() if f.is_symlink()]
    assert path not in opened
    first.unregister(None)
    # A span already handed out still names the segment; it was never mapped.
    assert bytes(span.read()[:8]) == b"12345678"


@pytest.mark.parametrize("copies", ["guarded"], indirect=True)
def test_a_segment_is_mapped_while_its_region_is_registered(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    """With the guarded copy a region's segment stays mapped (the mapping holds a
    descriptor of it) until the region goes; then every table lets it go."""
    first, second = tables
    key = segment("a", 64)
    first.register("a", key, 0, 64)
    write(second, ShmRef("a", 8), b"12345678")
    assert read(first, ShmRef("a", 8)) == b"12345678"
    path = f"/dev/shm/{key[1:]}"
    assert path in Path("/proc/self/maps").read_text()
    span = second.span(ShmRef("a", 8), "input x")
    first.unregister(None)
    assert second.status(None) == []
    # A span handed out before still copies: its mapping lasts as long as it does.
    assert bytes(span.read()) == b"12345678"
    assert path in Path("/proc/self/maps").read_text()
    del span
    assert path not in Path("/proc/self/maps").read_text()
    opened = [os.readlink(f) for f in Path("/proc/self/fd").iterdir() if f.is_symlink()]
    assert path not in opened


def test_reregistering_a_name_uses_the_new_segment(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    first, second = tables
    old, new = segment("old", 64), segment("new", 64)
    Path("/dev/shm", new[1:]).write_bytes(b"N" * 64)
    first.register("r", old, 0, 64)
    assert read(second, ShmRef("r", 1)) == b"\x00"
    first.unregister("r")
    first.register("r", new, 0, 64)
    assert read(second, ShmRef("r", 1)) == b"N"


def test_a_replaced_segment_must_be_registered_again(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    first, second = tables
    key = segment("r", 64)
    first.register("r", key, 0, 64)
    read(second, ShmRef("r", 8))
    Path("/dev/shm", key[1:]).unlink()
    with pytest.raises(BadRequest, match=r"cannot be opened .*; register region 'r' again"):
        read(second, ShmRef("r", 8))
    segment("r", 64)
    for call in (lambda: read(second, ShmRef("r", 8)), lambda: write(first, ShmRef("r", 8), b"")):
        with pytest.raises(BadRequest) as caught:
            call()
        assert f"shared memory key '{key}' of region 'r' was replaced" in caught.value.message
        assert "register region 'r' again" in caught.value.message


def test_a_shrunken_segment_is_a_client_error_naming_both_sizes(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    first, second = tables
    key = segment("r", 256)
    path = Path("/dev/shm", key[1:])
    first.register("r", key, 64, 128)
    span = second.span(ShmRef("r", 64, 32), "input x")
    os.truncate(path, 100)
    for call in (span.read, span.check, lambda: write(first, ShmRef("r", 8), b"x")):
        with pytest.raises(BadRequest) as caught:
            call()
        message = caught.value.message
        assert f"shared memory key '{key}' of region 'r' shrank to 100 bytes" in message
        assert "needs 192" in message
    os.truncate(path, 0)
    with pytest.raises(BadRequest, match="shrank to 0 bytes"):
        second.target(ShmRef("r", 8), "output y")
    os.truncate(path, 256)
    assert bytes(span.read()) == bytes(64)


@pytest.mark.parametrize("copies", ["pread"], indirect=True)
def test_a_segment_shrinking_during_a_copy_is_a_client_error(
    tables: tuple[RegionTable, RegionTable],
    segment: Callable[[str, int], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client truncates its segment between the size check and the copy.

    The copy functions are the real ones; the truncation is made to land in
    that window, where a mapping would have raised SIGBUS.
    """
    first, _ = tables
    key = segment("r", 1 << 16)
    path = Path("/dev/shm", key[1:])
    first.register("r", key, 0, 1 << 16)
    span = first.span(ShmRef("r", 1 << 15, 4096), "input x")
    real_preadv, real_pwritev = os.preadv, os.pwritev

    def shrinking_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        os.truncate(path, 5000)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", shrinking_preadv)
    with pytest.raises(BadRequest) as caught:
        span.read_into(memoryview(bytearray(1 << 15)))
    assert "shrank to 5000 bytes while it was read; the request needs 65536" in str(
        caught.value.message
    )
    monkeypatch.setattr(os, "preadv", real_preadv)
    os.truncate(path, 1 << 16)

    def shrinking_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        os.truncate(path, 0)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", shrinking_pwritev)
    with pytest.raises(BadRequest) as caught:
        write(first, ShmRef("r", 100, 4096), b"y" * 100)
    message = caught.value.message
    assert "changed size while it was written (65536 bytes before, 4196 after)" in message
    # The write grew the file back no further than the region's end.
    assert path.stat().st_size <= 1 << 16


@pytest.mark.parametrize("copies", ["guarded"], indirect=True)
def test_a_mapped_segment_shrinking_during_a_copy_is_a_client_error(
    tables: tuple[RegionTable, RegionTable],
    segment: Callable[[str, int], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client truncates its mapped segment after the copy looked it up.

    The copy then touches pages past the file's end: the guarded copy stops
    there and the request fails, where a plain mapping's SIGBUS would have
    killed this process (the test's own).
    """
    first, _ = tables
    key = segment("r", 1 << 16)
    path = Path("/dev/shm", key[1:])
    path.write_bytes(bytes(1 << 16))  # the client's data: every page in memory
    first.register("r", key, 0, 1 << 16)
    span = first.span(ShmRef("r", 1 << 15, 4096), "input x")
    assert span.mapped is not None
    real_lstat = os.lstat
    shrink_to: list[int] = []

    def shrinking_lstat(where: str) -> os.stat_result:
        info = real_lstat(where)
        if shrink_to:
            os.truncate(path, shrink_to.pop())
        return info

    monkeypatch.setattr(os, "lstat", shrinking_lstat)
    shrink_to.append(5000)
    with pytest.raises(BadRequest) as caught:
        span.read_into(memoryview(bytearray(1 << 15)))
    assert "shrank to 5000 bytes while it was read; the request needs 65536" in str(
        caught.value.message
    )
    os.truncate(path, 1 << 16)
    shrink_to.append(0)
    with pytest.raises(BadRequest) as caught:
        span.write(memoryview(b"y" * 100))
    message = caught.value.message
    assert "shrank to 0 bytes while it was written; the request needs 65536" in message
    assert "incomplete" in message
    assert path.stat().st_size == 0  # a mapping never grows the file back
    path.write_bytes(bytes(1 << 16))
    span.write(memoryview(b"z" * 100))
    assert path.read_bytes()[4096 : 4096 + 101] == b"z" * 100 + b"\0"


@pytest.mark.parametrize("copies", ["guarded"], indirect=True)
def test_a_segment_shrinking_while_it_is_mapped_is_a_client_error(
    tables: tuple[RegionTable, RegionTable],
    segment: Callable[[str, int], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client truncates its segment between the size check and the mapping.

    mmap then refuses the length; the span is made without a mapping and its
    copy names the new size, as for a shrink seen at the look-up.
    """
    first, _ = tables
    key = segment("r", 1 << 16)
    path = Path("/dev/shm", key[1:])
    first.register("r", key, 0, 1 << 16)
    real_fstat = os.fstat
    shrink_to = [5000]

    def shrinking_fstat(fd: int) -> os.stat_result:
        info = real_fstat(fd)
        if shrink_to:
            os.truncate(path, shrink_to.pop())
        return info

    monkeypatch.setattr(os, "fstat", shrinking_fstat)
    span = first.span(ShmRef("r", 1 << 15, 4096), "input x")
    monkeypatch.setattr(os, "fstat", real_fstat)
    assert span.mapped is None
    with pytest.raises(BadRequest) as caught:
        span.read_into(memoryview(bytearray(1 << 15)))
    assert "shrank to 5000 bytes; the request needs 65536" in str(caught.value.message)
    os.truncate(path, 1 << 16)
    assert bytes(first.span(ShmRef("r", 1 << 15, 4096), "input x").read()) == bytes(1 << 15)


@pytest.mark.parametrize("copies", ["guarded"], indirect=True)
def test_holes_in_a_mapped_segment_are_copied_without_allocating_them(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    """Pages the client never wrote read as zeros and take no memory.

    A fault through the mapping would allocate and zero each page (10-30x
    pread's time for a hole); the span copies those with preadv/pwritev.
    """
    first, _ = tables
    key = segment("r", 1 << 20)
    path = Path("/dev/shm", key[1:])
    first.register("r", key, 0, 1 << 20)
    assert read(first, ShmRef("r", 1 << 20)) == bytes(1 << 20)
    assert path.stat().st_blocks == 0
    write(first, ShmRef("r", 4096, 8192), b"w" * 4096)
    assert path.stat().st_blocks * 512 == 4096  # the page written, no other
    assert read(first, ShmRef("r", 4096, 8192)) == b"w" * 4096
    path.write_bytes(b"v" * (1 << 20))  # every page in memory: copied through the mapping
    span = first.span(ShmRef("r", 1 << 20), "input x")
    assert span.mapped is not None
    assert bytes(span.read()) == b"v" * (1 << 20)


def test_a_fifo_is_refused_without_waiting(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    first, _ = tables
    key = segment("fifo", 0)
    path = Path("/dev/shm", key[1:])
    path.unlink()
    os.mkfifo(path, 0o600)
    with pytest.raises(BadRequest, match="is not a shared-memory segment"):
        first.register("f", key, 0, 8)
    key = segment("swap", 64)
    first.register("s", key, 0, 64)
    Path("/dev/shm", key[1:]).unlink()
    os.mkfifo(Path("/dev/shm", key[1:]), 0o600)
    with pytest.raises(BadRequest, match="is not a shared-memory segment"):
        read(first, ShmRef("s", 8))


@pytest.mark.parametrize(
    ("key", "offset", "size", "words"),
    [
        ("/never-made", 0, 8, "unable to open shared memory key"),
        ("small", 0, 128, "holds 64 bytes, fewer than offset 0 + byte_size 128"),
        ("small", 60, 8, "fewer than offset 60 + byte_size 8"),
        ("/appliance-1234-status", 0, 8, "appliance's own segments"),
        ("/a/b", 0, 8, "not a valid POSIX name"),
        ("/", 0, 8, "not a valid POSIX name"),
        ("small", 0, 0, "byte_size > 0"),
    ],
)
def test_bad_registrations_name_the_problem(
    tables: tuple[RegionTable, RegionTable],
    segment: Callable[[str, int], str],
    key: str,
    offset: int,
    size: int,
    words: str,
) -> None:
    small = segment("small", 64)
    with pytest.raises(BadRequest) as caught:
        tables[0].register("r", small if key == "small" else key, offset, size)
    assert words in caught.value.message


def test_names_are_unique_and_views_stay_inside_their_region(
    tables: tuple[RegionTable, RegionTable], segment: Callable[[str, int], str]
) -> None:
    first, second = tables
    key = segment("r", 128)
    first.register("r", key, 0, 100)
    with pytest.raises(RegionExists, match="already registered"):
        second.register("r", key, 0, 100)
    with pytest.raises(BadRequest, match="exceed the 100 bytes of region 'r'"):
        second.span(ShmRef("r", 64, 40), "input x")
    with pytest.raises(BadRequest, match="no system shared memory region named 'q'"):
        second.status("q")


def test_cuda_regions_share_the_namespace_and_fail_with_the_reason_without_a_gpu(
    tables: tuple[RegionTable, RegionTable],
    segment: Callable[[str, int], str],
    tmp_path: Path,
) -> None:
    """A CUDA region another process registered, on a host where none opens."""
    if not cuda_driver_missing():
        pytest.skip("a GPU is usable here: tests/system/test_cuda_shm.py covers CUDA regions")
    first, second = tables
    with first._exclusive() as data:  # what register_cuda writes on a GPU host
        data["serial"] += 1
        handle = base64.b64encode(bytes(64)).decode()
        data["cuda"]["gpu"] = asdict(CudaRegion("gpu", handle, 0, 256, data["serial"]))
    assert [r.status() for r in second.cuda_status(None)] == [
        {"name": "gpu", "device_id": 0, "byte_size": 256}
    ]
    with pytest.raises(RegionExists, match="already registered \\(as a CUDA region\\)"):
        second.register("gpu", segment("s", 64), 0, 64)
    with pytest.raises(BadRequest, match="exceed the 256 bytes of CUDA region 'gpu'"):
        second.target(ShmRef("gpu", 64, 200), "output y")
    # The frontend does not open it: it names the place for the model worker.
    assert second.read(ShmRef("gpu", 16, 32), "input x") == CudaPlace(
        "gpu", data["serial"], handle, 0, 32, 16
    )
    assert second.target(ShmRef("gpu", 64, 64), "output y") == CudaPlace(
        "gpu", data["serial"], handle, 0, 64, 64
    )
    with pytest.raises(BadRequest, match="region 'gpu' does not open on GPU 0"):
        CudaRegions(tmp_path).open(CudaPlace("gpu", data["serial"], handle, 0, 16, 16))
    copying = RegionTable(tmp_path, cuda_copies="frontend")
    try:
        with pytest.raises(BadRequest, match="CUDA region 'gpu' does not open in this process"):
            copying.read(ShmRef("gpu", 16), "input x")
    finally:
        copying.close()
    with pytest.raises(Unsupported, match="this server is CPU-only"):
        second.register_cuda("other", bytes(64), 0, 64)
    second.unregister("gpu")  # the system kind: the CUDA region stays
    assert [r.name for r in first.cuda_status(None)] == ["gpu"]
    first.unregister("gpu", "cuda")
    assert first.cuda_status(None) == []
    with pytest.raises(BadRequest, match="no CUDA shared memory region named 'gpu'"):
        second.cuda_status("gpu")
