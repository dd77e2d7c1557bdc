"""MIP framing and TENSOR items: byte-level facts, round trips, hostile bytes."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from appliance.protocols.mip import codec, items
from appliance.protocols.mip.client import encode_request, tensor_item
from appliance.protocols.mip.codec import (
    BadVersion,
    ErrorCode,
    Frame,
    FrameReader,
    ItemType,
    MipError,
    Oversized,
)

PING = bytes([0, 1, 0, 0, 0, 0, 0, 0])
# PROTOCOL-FACTS §4.2: KubeMo's client's layout, batch of 2, JSON + TEXT.
KUBEMO_PAYLOAD = (
    bytes.fromhex("02000002")
    + bytes.fromhex("000000020000000f")
    + b"[0.0, 1.0, 2.0]"
    + bytes.fromhex("0000000100000002")
    + b"hi"
    + bytes.fromhex("000000020000000f")
    + b"[3.0, 4.0, 5.0]"
    + bytes.fromhex("0000000100000002")
    + b"yo"
)
KUBEMO_REQUEST = bytes.fromhex("00020000") + struct.pack("!L", 70) + KUBEMO_PAYLOAD


def events(reader: FrameReader) -> list[codec.Event]:
    found = []
    while (event := reader.next_event()) is not None:
        found.append(event)
    return found


def test_the_kubemo_capture_decodes() -> None:
    reader = FrameReader(1 << 20)
    reader.feed(KUBEMO_REQUEST)
    [frame] = events(reader)
    assert isinstance(frame, Frame)
    assert (frame.header.kind, frame.header.subtype, frame.header.remaining) == (2, 0, 70)
    request = codec.decode_infer_request(frame.payload)
    assert (request.n_input, request.n_output, request.batch_size) == (2, 0, 2)
    assert request.item(1, 0).type is ItemType.JSON
    assert bytes(request.item(1, 1).data) == b"yo"
    assert not reader.mid_frame


def test_frames_arrive_byte_by_byte_and_pipelined() -> None:
    reader = FrameReader(1 << 20)
    stream = PING + KUBEMO_REQUEST + PING
    found: list[codec.Event] = []
    for index in range(len(stream)):
        reader.feed(stream[index : index + 1])
        found += events(reader)
        if index == 3:
            assert reader.mid_frame
    assert [type(e) for e in found] == [Frame, Frame, Frame]
    assert [e.header.kind for e in found if isinstance(e, Frame)] == [1, 2, 1]


def test_a_large_payload_is_received_into_its_own_buffer() -> None:
    reader = FrameReader(1 << 22)
    payload = bytes(range(256)) * 8192
    reader.feed(codec.encode_header(2, 0, len(payload)) + payload[:10])
    assert events(reader) == []
    # The payload's buffer is lent out (no staging copy), growing as bytes
    # arrive: a header alone does not cost the size it claims.
    received, lent = 10, []
    while received < len(payload):
        buffer = reader.get_buffer()
        lent.append(len(buffer))
        buffer[:] = payload[received : received + len(buffer)]
        reader.buffer_updated(len(buffer))
        received += len(buffer)
    assert received == len(payload)
    assert lent[0] < len(payload) // 4
    assert lent[-1] > 64 * 1024
    [frame] = events(reader)
    assert isinstance(frame, Frame)
    assert frame.payload == payload


def test_an_oversized_frame_is_reported_then_skipped() -> None:
    reader = FrameReader(16)
    reader.feed(codec.encode_header(2, 0, 100) + b"x" * 60)
    [event] = events(reader)
    assert isinstance(event, Oversized)
    assert reader.mid_frame
    reader.feed(b"x" * 40 + PING)
    [ping] = events(reader)
    assert isinstance(ping, Frame)
    assert ping.header.kind == 1


def test_a_bad_version_stops_the_reader() -> None:
    reader = FrameReader(16)
    reader.feed(bytes([1, 1, 0, 0, 0, 0, 0, 0]) + PING)
    [event] = events(reader)
    assert isinstance(event, BadVersion)
    assert reader.closed
    reader.feed(PING * 10_000)
    assert events(reader) == []


def test_request_checks_follow_the_reference_order() -> None:
    header = codec.decode_header(bytes([0, 7, 1, 0, 0, 0, 0, 0]))
    error = codec.check_request(header)
    assert error is not None
    assert error.code is ErrorCode.SUBTYPE
    method = codec.check_request(codec.decode_header(bytes([0, 7, 0, 0, 0, 0, 0, 0])))
    assert method is not None
    assert method.code is ErrorCode.METHOD
    assert codec.check_request(codec.decode_header(PING)) is None


def test_error_frames_and_pong() -> None:
    assert bytes([0, 1, 1, 0, 0, 0, 0, 0]) == codec.PONG
    assert codec.encode_error(ErrorCode.METHOD) == bytes([0, 0, 2, 0, 0, 0, 0, 0])
    frame = codec.encode_error(ErrorCode.SHAPE, "bad")
    assert frame == bytes([0, 0, 4, 0, 0, 0, 0, 3]) + b"bad"


def test_the_response_header_carries_the_true_output_count() -> None:
    pieces = codec.encode_item(ItemType.TEXT, [b"a"]) * 3
    frame = codec.encode_infer_response(1, 3, 1, pieces)
    assert frame[:4] == bytes([0, 2, 1, 0])
    assert struct.unpack("!L", frame[4:8])[0] == len(frame) - 8
    assert frame[8:12] == bytes([1, 3, 0, 1])


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b"", "at least the 4-byte"),
        (bytes([0, 0, 0, 1]), "n-input 0"),
        (bytes([1, 0, 0, 0]), "batch size 0"),
        (bytes([1, 0, 0, 1, 0, 0]), "before its header"),
        (bytes([1, 0, 0, 1]) + struct.pack("!2L", 1, 9) + b"abc", "before 9 bytes"),
        (bytes([1, 0, 0, 1]) + struct.pack("!2L", 9, 0), "unknown type 9"),
        (bytes([1, 0, 0, 1]) + struct.pack("!2L", 1, 0) + b"zz", "2 bytes after"),
    ],
)
def test_payloads_that_do_not_match_their_header_are_shape_errors(
    payload: bytes, words: str
) -> None:
    with pytest.raises(MipError, match=words) as caught:
        codec.decode_infer_request(payload)
    assert caught.value.code is ErrorCode.SHAPE


def test_the_tensor_item_layout_is_as_documented() -> None:
    kind, data = tensor_item(np.array([[1, 2, 3]], dtype=np.int32))
    assert kind is ItemType.TENSOR
    assert data[:4] == bytes([8, 2, 0, 0])  # INT32, ndim 2, reserved
    assert data[4:12] == struct.pack("!2L", 1, 3)
    assert data[12:] == np.array([1, 2, 3], dtype="<i4").tobytes()
    _kind, text = tensor_item(np.array([b"ab", b""], dtype=object))
    assert text == bytes([13, 1, 0, 0]) + struct.pack("!L", 2) + b"\x02\0\0\0ab\0\0\0\0"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x0b", "at least 4 bytes"),
        (bytes([0, 0, 0, 0]), "dtype code 0"),
        (bytes([11, 1, 0, 1]) + struct.pack("!L", 1), "reserved 1"),
        (bytes([11, 40, 0, 0]), "ndim 40"),
        (bytes([11, 2, 0, 0]) + struct.pack("!L", 2), "inside its 2 dims"),
        (bytes([11, 1, 0, 0]) + struct.pack("!L", 2) + b"\0" * 7, "needs 8 bytes"),
        (bytes([13, 1, 0, 0]) + struct.pack("!L", 1 << 30), "at least 4294967296"),
        (bytes([13, 1, 0, 0]) + struct.pack("!L", 1) + b"\x09\0\0\0a", "claims 9 bytes"),
    ],
)
def test_broken_tensor_items_are_shape_errors(data: bytes, words: str) -> None:
    with pytest.raises(MipError, match=words) as caught:
        items.decode_tensor(memoryview(data), "here")
    assert caught.value.code is ErrorCode.SHAPE


@settings(max_examples=150, deadline=None)
@given(hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0)))
def test_tensor_items_round_trip(array: np.ndarray) -> None:
    if array.dtype.kind not in "biuf" or array.dtype.itemsize > 8:
        return
    _kind, data = tensor_item(array)
    back = items.decode_tensor(memoryview(data), "here")
    assert back.shape == array.shape
    assert back.dtype == array.dtype.newbyteorder("<") or back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=20), max_size=6))
def test_bytes_tensor_items_round_trip(elements: list[bytes]) -> None:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    _kind, data = tensor_item(array)
    assert items.decode_tensor(memoryview(data), "here").tolist() == elements


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_either_decode_or_raise_mip_error(data: bytes) -> None:
    reader = FrameReader(64)
    reader.feed(data)
    for event in events(reader):
        if isinstance(event, Frame):
            with contextlib.suppress(MipError):
                codec.decode_infer_request(event.payload)
    for decode in (codec.decode_infer_request, lambda d: items.decode_tensor(memoryview(d), "x")):
        with contextlib.suppress(MipError):
            decode(data)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=30), min_size=1, max_size=3), min_size=1, max_size=4))
def test_requests_round_trip_through_the_reader(texts: list[list[bytes]]) -> None:
    width = len(texts[0])
    batch = [[(ItemType.TEXT, t) for t in (row + row * width)[:width]] for row in texts]
    reader = FrameReader(1 << 20)
    reader.feed(encode_request(batch))
    [frame] = events(reader)
    assert isinstance(frame, Frame)
    request = codec.decode_infer_request(frame.payload)
    assert request.batch_size == len(batch)
    decoded = [
        [bytes(request.item(e, i).data) for i in range(request.n_input)]
        for e in range(request.batch_size)
    ]
    assert decoded == [[data for _type, data in element] for element in batch]
