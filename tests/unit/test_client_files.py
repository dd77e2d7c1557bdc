"""A model worker writing outputs into a client's file, from the place a frontend sent."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from appliance.core.client_memory import WRITTEN, ClientSpan
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest
from appliance.worker.client_files import file_targets, write_files

SIZE = 4096


@pytest.fixture
def segment() -> Iterator[Path]:
    path = Path(f"/dev/shm/files{os.getpid()}")
    path.write_bytes(bytes(SIZE))
    yield path
    path.unlink(missing_ok=True)


def span_of(path: Path, start: int, nbytes: int) -> ClientSpan:
    info = path.stat()
    return ClientSpan(
        str(path),
        start,
        nbytes,
        SIZE,
        f"shared memory key '/{path.name}' of region 'out'",
        "output y",
        (info.st_dev, info.st_ino),
        "; register region 'out' again",
    )


def sent(targets: dict[str, ClientSpan]) -> object:
    """The targets as a descriptor carries them to the worker."""
    return orjson.loads(orjson.dumps({n: span.to_body() for n, span in targets.items()}))


def test_a_span_travels_to_the_worker_unchanged(segment: Path) -> None:
    span = span_of(segment, 100, 64)
    assert file_targets(sent({"y": span}), frozenset({"y"})) == {"y": span}
    assert file_targets({"y": {"cuda": []}}, None) is None  # CUDA places are not files


def test_outputs_land_at_their_place_and_the_reply_carries_no_bytes(segment: Path) -> None:
    files = file_targets(sent({"y": span_of(segment, 100, 64)}), None)
    assert files is not None
    values = np.arange(16, dtype=np.int32)
    words = Tensor(DType.BYTES, (1,), np.array([b"abc"], dtype=object))
    entries = write_files(files, {"y": Tensor.from_array(values), "z": words})
    assert entries == {"y": ["y", "INT32", [16], WRITTEN]}
    content = segment.read_bytes()
    assert content[100:164] == values.tobytes()
    assert content[:100] == bytes(100)
    assert content[164:] == bytes(SIZE - 164)


def test_strings_are_left_to_the_frontend(segment: Path) -> None:
    files = {"y": span_of(segment, 0, 64)}
    words = Tensor(DType.BYTES, (1,), np.array([b"abc"], dtype=object))
    assert write_files(files, {"y": words}) == {}
    assert segment.read_bytes() == bytes(SIZE)


def test_an_output_larger_than_its_place_is_the_clients_error(segment: Path) -> None:
    files = {"y": span_of(segment, 0, 32)}
    with pytest.raises(BadRequest, match="output y needs 64 bytes but its shared_memory_byte_size"):
        write_files(files, {"y": Tensor.from_array(np.zeros(16, np.int32))})
    assert segment.read_bytes() == bytes(SIZE)


def test_a_replaced_file_is_refused(segment: Path) -> None:
    files = {"y": span_of(segment, 0, 64)}
    segment.unlink()
    segment.write_bytes(bytes(SIZE))
    with pytest.raises(BadRequest, match=r"replaced by another segment.*register region 'out'"):
        write_files(files, {"y": Tensor.from_array(np.zeros(16, np.int32))})


@pytest.mark.parametrize(
    "place",
    [
        {"file": ["/etc/passwd", 0, 8, 8, "l", "w", -1, -1, ""]},
        {"file": ["/dev/shm/x", 8, 8, 8, "l", "w", -1, -1, ""]},
        {"file": ["/dev/shm/x", -1, 8, 8, "l", "w", -1, -1, ""]},
        {"file": ["/dev/shm/x", 0, 8]},
        {"file": "nonsense"},
    ],
)
def test_a_malformed_place_is_refused(place: dict[str, object]) -> None:
    with pytest.raises(BadRequest, match="bad shared memory place"):
        file_targets({"y": place}, None)


def test_a_place_for_an_undeclared_output_is_refused(segment: Path) -> None:
    with pytest.raises(BadRequest, match="no output named 'q'; its outputs are y"):
        file_targets(sent({"q": span_of(segment, 0, 8)}), frozenset({"y"}))
