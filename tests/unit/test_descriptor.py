"""The descriptor codec: round trips, placement of tensor bytes, and fuzzing."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from appliance.config.reader import from_dict
from appliance.config.settings import MAX_INLINE_BYTES, ConfigError
from appliance.core.descriptor import (
    DescriptorError,
    Kind,
    Message,
    from_frame,
    from_frames,
    join_frames,
    to_frame,
)
from appliance.core.dtypes import DType, to_numpy
from appliance.core.message_tensors import SegmentReader, place_tensors, read_tensors
from appliance.core.output_parameters import OutputsWithParameters, from_body
from appliance.core.ring import Ring
from appliance.core.segment import Segment
from appliance.core.tensor import Tensor


@pytest.fixture
def ring() -> Ring:
    name = f"appliance-unittest-p{__import__('os').getpid()}-ring"
    segment = Segment.create(name, 1 << 20)
    ring = Ring(segment, name, 8 << 20, 8 << 20)
    yield ring
    ring.close()


def roundtrip(tensors: dict[str, Tensor], ring: Ring, threshold: int) -> dict[str, Tensor]:
    payloads: list[object] = []
    blocks: list[object] = []
    entries = place_tensors(tensors, ring, threshold, payloads, blocks)  # type: ignore[arg-type]
    message = Message(Kind.INFER, 7, 42, {"tensors": entries}, payloads, deadline=1.5)
    decoded = from_frame(to_frame(message))
    assert (decoded.kind, decoded.request_id, decoded.pid, decoded.deadline) == (
        Kind.INFER,
        7,
        42,
        1.5,
    )
    reader = SegmentReader(Segment.attach)
    return read_tensors(decoded.body["tensors"], decoded.payloads, reader)


numeric = st.sampled_from([d for d in DType if d is not DType.BYTES])


@given(
    dtype=numeric,
    data=st.data(),
    threshold=st.sampled_from([0, 16, MAX_INLINE_BYTES]),
)
def test_numeric_tensors_round_trip(dtype: DType, data: st.DataObject, threshold: int) -> None:
    name = f"appliance-unittest-p{__import__('os').getpid()}-hyp"
    ring = Ring(Segment.create(name, 1 << 16), name, 8 << 20, 8 << 20)
    try:
        array = data.draw(hnp.arrays(to_numpy(dtype), hnp.array_shapes(min_dims=0, max_side=20)))
        out = roundtrip({"t": Tensor.from_array(array)}, ring, threshold)["t"]
        assert out.dtype is dtype
        np.testing.assert_array_equal(out.array(), array)
    finally:
        ring.close()


@given(st.lists(st.binary(max_size=40), max_size=12))
def test_bytes_tensors_round_trip(elements: list[bytes]) -> None:
    array = np.array([*elements, b""], dtype=object)
    name = f"appliance-unittest-p{__import__('os').getpid()}-hypb"
    ring = Ring(Segment.create(name, 1 << 16), name, 8 << 20, 8 << 20)
    try:
        out = roundtrip({"s": Tensor.from_array(array)}, ring, 8)["s"]
        assert out.array().tolist() == array.tolist()
    finally:
        ring.close()


def test_tensor_bytes_above_the_threshold_never_ride_in_the_message(ring: Ring) -> None:
    payloads: list[object] = []
    blocks: list[object] = []
    big = Tensor.from_array(np.zeros(MAX_INLINE_BYTES // 4 + 1, np.float32))
    small = Tensor.from_array(np.zeros(4, np.float32))
    entries = place_tensors({"big": big, "small": small}, ring, MAX_INLINE_BYTES, payloads, blocks)  # type: ignore[arg-type]
    frame = to_frame(Message(Kind.INFER, 1, 1, {"tensors": entries}, payloads))
    assert len(frame) < 1024
    assert isinstance(entries[0][3], list)
    assert entries[1][3] == 0


def test_the_inline_threshold_cannot_exceed_64_kib() -> None:
    with pytest.raises(ConfigError, match="inline_threshold_bytes: must be at most 65536"):
        from_dict({"shm": {"inline_threshold_bytes": MAX_INLINE_BYTES + 1}}, "t.toml")


def test_one_frame_carries_several_messages_in_order() -> None:
    sent = [
        Message(Kind.INFER, 1, 9, {"model": "m", "tensors": []}, [b"abc"], deadline=2.0, channel=3),
        Message(Kind.RELEASE, 0, 9, {"blocks": [["seg", 0, 64]]}),
        Message(Kind.INFER, 2, 9, {"model": "m"}, [b"", b"xyz" * 5], channel=3),
    ]
    frame = join_frames([to_frame(message) for message in sent])
    got = from_frames(frame)
    assert [(m.kind, m.request_id, m.channel, m.deadline) for m in got] == [
        (m.kind, m.request_id, m.channel, m.deadline) for m in sent
    ]
    assert [[bytes(p) for p in m.payloads] for m in got] == [[b"abc"], [], [b"", b"xyz" * 5]]
    assert got[1].body == {"blocks": [["seg", 0, 64]]}
    # A lone message is sent as it is, and read back alone.
    assert join_frames([to_frame(sent[1])]) == to_frame(sent[1])
    assert len(from_frames(to_frame(sent[1]))) == 1


def test_a_frame_of_several_refuses_a_bad_message_among_them() -> None:
    good = to_frame(Message(Kind.REPLY, 1, 9, {"tensors": []}))
    with pytest.raises(DescriptorError, match="header bytes"):
        from_frames(good + good[:10])
    with pytest.raises(DescriptorError, match="stray bytes"):
        from_frame(good + good)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_descriptor_error(frame: bytes) -> None:
    with contextlib.suppress(DescriptorError):
        from_frame(frame)
    with contextlib.suppress(DescriptorError):
        from_frames(frame)


@given(st.binary(max_size=120))
def test_corrupted_real_frames_decode_or_raise_descriptor_error(noise: bytes) -> None:
    frame = bytearray(to_frame(Message(Kind.REPLY, 3, 9, {"tensors": []}, [b"abc"])))
    for index, value in enumerate(noise):
        frame[(index * 7) % len(frame)] = value
    with contextlib.suppress(DescriptorError):
        from_frame(bytes(frame))


def test_outputs_with_parameters_carry_them_in_their_entries(ring: Ring) -> None:
    outputs = OutputsWithParameters(
        {"y": Tensor.from_array(np.ones(3, np.float32)), "z": Tensor.from_array(np.zeros(1))},
        {"y": {"content_type": "np", "dropped": object()}, "nope": {"a": 1}},
    )
    payloads: list[object] = []
    entries = place_tensors(outputs, ring, 8, payloads, [])  # type: ignore[arg-type]
    body = from_frame(to_frame(Message(Kind.REPLY, 1, 1, {"tensors": entries}, payloads))).body
    assert from_body(body) == {"y": {"content_type": "np"}}
    read = read_tensors(body["tensors"], payloads, SegmentReader(Segment.attach))
    assert read["y"].array().tolist() == [1.0, 1.0, 1.0]
    assert from_body({"tensors": place_tensors({"y": outputs["y"]}, ring, 64, [], [])}) == {}
