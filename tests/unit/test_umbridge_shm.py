"""The UM-Bridge shared-memory side channel against real /dev/shm files."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import spec
from appliance.protocols.umbridge import shm
from appliance.protocols.umbridge.codec import interface_of
from appliance.protocols.umbridge.errors import UmBridgeError

IFACE = interface_of(
    ModelMetadata(
        "m",
        ("1",),
        "python",
        (spec("a", "FP64", [-1, 3]), spec("b", "FP64", [-1, 0])),
        (spec("y", "FP64", [-1, 2]),),
        4,
        {"predict": True},
    )
)


@pytest.fixture
def tid() -> Iterator[str]:
    tid = uuid.uuid4().hex[:10]
    yield tid
    for path in Path("/dev/shm").glob(f"umbridge*{tid}*"):
        path.unlink()


def segment(name: str, nbytes: int) -> shared_memory.SharedMemory:
    """Create a segment as umbridge's Python client does."""
    return shared_memory.SharedMemory(f"/{name}", create=True, size=nbytes)


def release(memory: shared_memory.SharedMemory) -> None:
    memory.close()
    memory.unlink()


def test_inputs_are_read_and_outputs_written_without_unlinking(tid: str) -> None:
    inp = segment(f"umbridge_in_{tid}_0", 24)
    out = segment(f"umbridge_out_{tid}_0", 16)
    try:
        np.ndarray((3,), dtype=np.float64, buffer=inp.buf)[:] = [1.5, -2.0, 3.25]
        request = {
            "tid": tid,
            "shmem_name": "/umbridge",
            "shmem_num_inputs": 2,
            "shmem_size_0": 3,
            "shmem_size_1": 0,  # an empty vector has no segment at all
        }
        channel = shm.Channel.from_request(request)
        a, b = channel.read_inputs(request, IFACE)
        assert a.tolist() == [1.5, -2.0, 3.25]
        assert b.size == 0
        channel.write_outputs([np.array([7.0, 8.0])])
        assert np.ndarray((2,), dtype=np.float64, buffer=out.buf).tolist() == [7.0, 8.0]
        assert Path(f"/dev/shm/umbridge_in_{tid}_0").exists()
        assert Path(f"/dev/shm/umbridge_out_{tid}_0").exists()
    finally:
        release(inp)
        release(out)


def test_probe_copies_the_test_value(tid: str) -> None:
    inp = segment(f"umbridge_test_shmem_in_{tid}", 8)
    out = segment(f"umbridge_test_shmem_out_{tid}", 8)
    try:
        np.ndarray((1,), dtype=np.float64, buffer=inp.buf)[0] = 12345.0
        assert shm.probe({"tid": tid}) == 12345.0
        assert np.ndarray((1,), dtype=np.float64, buffer=out.buf)[0] == 12345.0
    finally:
        release(inp)
        release(out)
    assert shm.probe({"tid": tid}) is None


@pytest.mark.parametrize(
    "name", ["/appliance-x", "/umbridge/../../etc", "umbridge x", "", 7, None, "/dev/shm/umbridge"]
)
def test_names_outside_umbridges_namespace_are_refused(name: object) -> None:
    with pytest.raises(UmBridgeError, match="'shmem_name' must be"):
        shm.Channel.from_request({"shmem_name": name, "tid": "1"})


@pytest.mark.parametrize("tid", ["../x", "a/b", "", "x" * 65, None, -1, 1.5])
def test_bad_thread_ids_are_refused(tid: object) -> None:
    with pytest.raises(UmBridgeError, match="'tid' must be"):
        shm.Channel.from_request({"shmem_name": "/umbridge", "tid": tid})


def test_numeric_thread_ids_are_accepted() -> None:
    assert shm.Channel.from_request({"shmem_name": "umbridge", "tid": 42}).tid == "42"


def test_sizes_are_checked_against_the_real_segment(tid: str) -> None:
    small = segment(f"umbridge_in_{tid}_0", 8)
    try:
        with pytest.raises(UmBridgeError, match="holds 8 bytes, fewer than the 24 bytes"):
            shm.read_segment(f"umbridge_in_{tid}_0", 3)
        with pytest.raises(UmBridgeError, match="holds 8 bytes, fewer than the 16 bytes"):
            shm.write_segment(f"umbridge_in_{tid}_0", np.zeros(2))
    finally:
        release(small)
    with pytest.raises(UmBridgeError, match="cannot be opened"):
        shm.read_segment(f"umbridge_in_{tid}_0", 1)


def test_a_directory_is_not_a_segment(tid: str) -> None:
    path = Path(f"/dev/shm/umbridge_dir_{tid}")
    path.mkdir()
    try:
        with pytest.raises(UmBridgeError):
            shm.read_segment(path.name, 1)
    finally:
        os.rmdir(path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tid: str) -> None:
    path = Path(f"/dev/shm/umbridge_in_{tid}_0")
    os.mkfifo(path, 0o600)
    with pytest.raises(UmBridgeError, match="is not a shared-memory segment"):
        shm.read_segment(path.name, 1)
    with pytest.raises(UmBridgeError, match="is not a shared-memory segment"):
        shm.write_segment(path.name, np.zeros(1))


def test_a_segment_shrinking_during_a_copy_is_invalid_input(
    tid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client truncates its segment between the size check and the copy.

    The copies are the real ones; the truncation is made to land in that
    window, where a mapping would have raised SIGBUS.
    """
    name = f"umbridge_in_{tid}_0"
    path = Path("/dev/shm", name)
    path.write_bytes(bytes(8 * 1024))
    real_preadv, real_pwritev = os.preadv, os.pwritev

    def shrinking_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        os.truncate(path, 100)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", shrinking_preadv)
    with pytest.raises(UmBridgeError) as caught:
        shm.read_segment(name, 1024)
    assert caught.value.status == 400
    assert "shrank to 100 bytes while it was read; the request needs 8192" in caught.value.message
    monkeypatch.setattr(os, "preadv", real_preadv)

    def shrinking_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        os.truncate(path, 0)
        return real_pwritev(fd, buffers, offset)

    path.write_bytes(bytes(8 * 1024))
    monkeypatch.setattr(os, "pwritev", shrinking_pwritev)
    with pytest.raises(UmBridgeError) as caught:
        shm.write_segment(name, np.ones(4))
    assert "changed size while it was written (8192 bytes before, 32 after)" in (
        caught.value.message
    )
