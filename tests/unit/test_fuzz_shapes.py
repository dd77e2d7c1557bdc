"""Hostile shapes and sizes in every codec: claims that must not become allocations.

A shape may claim any element count (dims past 2**62, products that overflow,
a zero dim beside huge ones, negative or too many dims), a length field may
claim more bytes than were sent, and a request may claim millions of items.
Each codec must answer with its own error, allocate in proportion to what
arrived, and never hand numpy a shape it refuses with a ValueError.
"""

from __future__ import annotations

import contextlib
import json
import struct
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.core import descriptor, message_tensors
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest
from appliance.protocols.grps import codec as grps_codec
from appliance.protocols.grps import pbcodec as grps_pb
from appliance.protocols.grps.errors import GrpsError
from appliance.protocols.kserve import codec as kserve_codec
from appliance.protocols.kserve.errors import DecodeError
from appliance.protocols.mip import batch as mip_batch
from appliance.protocols.mip import codec as mip_codec
from appliance.protocols.mip import items as mip_items
from appliance.protocols.mip.client import encode_request
from appliance.protocols.mip.codec import ErrorCode, FrameReader, ItemType, MipError
from tests.unit.test_graphpipe_encoder import WT, encode_infer_request
from tools.fuzz import oracle, seeds
from tools.fuzz.seeds import NoSegments
from tools.fuzz.targets import TARGETS

SETTINGS = settings(
    max_examples=oracle.examples(150),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BIG = [2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**63 - 1]
dims = st.sampled_from([0, 0, 1, 2, 3, 16, *BIG])
shapes = st.one_of(
    st.lists(dims, max_size=6),
    st.lists(st.sampled_from([0, 1]), min_size=30, max_size=70),
)
payloads = st.binary(max_size=64)


@pytest.fixture(autouse=True, scope="module")
def _traced() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


def kserve_binary(shape: list[int], data: bytes, dtype: str) -> bytes:
    tensor = {"name": "x", "datatype": dtype, "shape": shape}
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(data)}}]})
    return b"\x01" + struct.pack("!I", len(header)) + header.encode() + data


def kserve_json(shape: list[int], data: bytes, dtype: str) -> bytes:
    values: list[Any] = list(data) if dtype != "BYTES" else [chr(65 + b % 26) for b in data]
    doc = {"inputs": [{"name": "x", "datatype": dtype, "shape": shape, "data": values}]}
    return b"\x00" + json.dumps(doc).encode()


def grps_json(shape: list[int], data: bytes, dtype: str) -> bytes:
    if dtype == "BYTES":
        tensor: dict[str, Any] = {
            "dtype": "DT_STRING",
            "flat_string": [chr(65 + b % 26) for b in data],
        }
    else:
        tensor = {"dtype": "DT_FLOAT32", "flat_float32": [float(b) for b in data]}
    return json.dumps({"gtensors": {"tensors": [{**tensor, "shape": shape}]}}).encode()


def grps_protobuf(shape: list[int], data: bytes, dtype: str) -> bytes:
    message = grps_pb.grps_pb2.GrpsMessage()
    tensor = message.gtensors.tensors.add(shape=[d % 2**32 for d in shape])
    if dtype == "BYTES":
        tensor.dtype = grps_pb.grps_pb2.DT_STRING
        tensor.flat_string.extend(chr(65 + b % 26) for b in data)
    else:
        tensor.dtype = grps_pb.grps_pb2.DT_FLOAT32
        tensor.flat_float32.extend(float(b) for b in data)
    return bytes(message.SerializeToString())


def graphpipe(shape: list[int], data: bytes, dtype: str) -> bytes:
    if dtype == "BYTES":
        wire = WT(12, shape, strings=[bytes([b]) for b in data])
    else:
        wire = WT(10, shape, data=data)
    return encode_infer_request([wire])


def mip(shape: list[int], data: bytes, dtype: str) -> bytes:
    code = 13 if dtype == "BYTES" else 11
    dims = [d % 2**32 for d in shape][:32]
    item = struct.pack(f"!BBH{len(dims)}L", code, len(dims), 0, *dims) + data
    payload = struct.pack("!2BH", 1, 0, 1) + struct.pack("!2L", 4, len(item)) + item
    return b"\xff" + mip_codec.encode_header(2, 0, len(payload)) + payload


def the_descriptor(shape: list[int], data: bytes, dtype: str) -> bytes:
    body = {"tensors": [["x", dtype, shape, 0]]}
    return descriptor.to_frame(descriptor.Message(descriptor.Kind.INFER, 1, 1, body, [data]))


BUILDERS = {
    "kserve_rest": [kserve_binary, kserve_json],
    "grps_json": [grps_json],
    "grps_pb": [grps_protobuf],
    "graphpipe": [graphpipe],
    "mip": [mip],
    "descriptor": [the_descriptor],
}


@pytest.mark.parametrize(
    ("name", "build"), [(name, build) for name, builds in BUILDERS.items() for build in builds]
)
def test_any_shape_is_accepted_or_refused_by_the_protocol(name: str, build: Any) -> None:
    @SETTINGS
    @given(shapes, payloads, st.sampled_from(["FP32", "BYTES"]))
    def run(shape: list[int], data: bytes, dtype: str) -> None:
        oracle.checked(TARGETS[name].run, build(shape, data, dtype))

    run()


# -- the bugs fuzzing found, one case each ------------------------------------------

HUGE = [0, 2**62, 2**62]  # no elements, but numpy refuses the shape


def test_kserve_refuses_huge_shapes_with_its_own_error() -> None:
    for builder in (kserve_binary, kserve_json):
        body = builder(HUGE, b"", "FP32")[1:]
        header_length = None
        if builder is kserve_binary:
            (header_length,) = struct.unpack_from("!I", body)
            body = body[4:]
        with pytest.raises(DecodeError, match=r"claims more than"):
            kserve_codec.decode_infer_request(body, header_length, "m")


def test_kserve_binary_bytes_must_have_room_for_their_element_count() -> None:
    body = kserve_binary([2**40], b"", "BYTES")[5:]
    header_length = len(body)
    with pytest.raises(DecodeError, match="BYTES needs at least 4398046511104 bytes"):
        kserve_codec.decode_infer_request(body, header_length, "m")


def test_grps_refuses_huge_shapes_in_json_and_protobuf() -> None:
    with pytest.raises(GrpsError, match="too big") as caught:
        grps_codec.decode_json_request(grps_json([0, 2**31, 2**31], b"", "FP32"))
    assert caught.value.code == 400
    message = grps_pb.GrpsMessage.FromString(grps_protobuf([0, 2**32 - 1] * 3, b"", "FP32"))
    with pytest.raises(GrpsError, match="too big"):
        grps_pb.decode_message(message)
    with pytest.raises(GrpsError, match="at most 64 dims"):
        grps_codec.decode_json_request(grps_json([0] * 65, b"", "FP32"))


def test_mip_tensor_items_refuse_huge_shapes() -> None:
    item = struct.pack("!BBH4L", 11, 4, 0, 0, 2**32 - 1, 2**32 - 1, 2**32 - 1)
    with pytest.raises(MipError, match="too big") as caught:
        mip_items.decode_tensor(memoryview(item), "item")
    assert caught.value.code is ErrorCode.SHAPE


def test_a_packed_bytes_tensor_is_checked_before_its_elements_are_allocated() -> None:
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    with pytest.raises(ValueError, match="cannot hold 1099511627776 elements"):
        Tensor(DType.BYTES, (2**40,), b"\x00" * 16).array()
    with pytest.raises(ValueError, match="cannot hold 3000000 elements"):
        Tensor(DType.BYTES, (3_000_000,), b"").array()
    assert tracemalloc.get_traced_memory()[1] - base < 1 << 20


def test_descriptors_refuse_negative_sizes_places_and_dims() -> None:
    header = descriptor.HEADER
    body = orjson.dumps({"inline": [-1000, 1003]})
    frame = header.pack(b"AP", 1, 2, 0, 0, 1, 1, 0.0, len(body)) + body + b"abc"
    with pytest.raises(descriptor.DescriptorError, match="not a byte count"):
        descriptor.from_frame(frame)
    for entry in (["x", "FP32", [-1], 0], ["x", "FP32", [1], -1], ["x", "FP32", [2**62, 0], 0]):
        with pytest.raises(BadRequest, match="is invalid"):
            message_tensors.read_tensors([entry], [memoryview(b"")], NoSegments())


def test_mip_refuses_millions_of_items_from_the_header() -> None:
    payload = struct.pack("!2BH", 255, 1, 65535) + b"\x00" * 64
    with pytest.raises(MipError, match="at most 65536") as caught:
        mip_codec.decode_infer_request(payload)
    assert caught.value.code is ErrorCode.MEMORY


def test_a_mip_header_alone_does_not_allocate_what_it_claims() -> None:
    reader = FrameReader(64 << 20)
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    reader.feed(mip_codec.encode_header(2, 0, 64 << 20) + b"\x01" * 100)
    assert reader.next_event() is None
    assert reader.mid_frame
    assert tracemalloc.get_traced_memory()[1] - base < 1 << 20
    assert len(reader.get_buffer()) < 1 << 20


@SETTINGS
@given(st.integers(1, 3 << 20), st.integers(4096, 300_000))
def test_a_mip_payload_arrives_whole_in_any_chunks(size: int, chunk: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    stream = mip_codec.encode_header(2, 0, size) + payload + bytes([0, 1, 0, 0, 0, 0, 0, 0])
    reader = FrameReader(4 << 20)
    found = []
    for start in range(0, len(stream), chunk):
        reader.feed(stream[start : start + chunk])
        while (event := reader.next_event()) is not None:
            found.append(event)
    assert [type(e).__name__ for e in found] == ["Frame", "Frame"]
    assert isinstance(found[0], mip_codec.Frame)
    assert bytes(found[0].payload) == payload


@pytest.mark.parametrize(
    ("body", "header_length", "words"),
    [
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [4],'
         b' "parameters": {"binary_data_size": 16}}]}', None, "exceeds the 0 bytes"),
        (b'{"inputs": []}', 1 << 40, "does not fit"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [4],'
         b' "parameters": {"binary_data_size": 8}}]}xxxxxxxx', 86, "8 bytes of data do not match"),
    ],
)  # fmt: skip
def test_kserve_sizes_that_claim_more_than_was_sent(
    body: bytes, header_length: int | None, words: str
) -> None:
    if header_length == 86:
        header_length = len(body) - 8
    with pytest.raises(DecodeError, match=words):
        kserve_codec.decode_infer_request(body, header_length, "m")


def test_mip_items_that_claim_more_than_was_sent() -> None:
    payload = struct.pack("!2BH", 1, 0, 1) + struct.pack("!2L", 1, 2**32 - 1) + b"abc"
    with pytest.raises(MipError, match="ends inside item 0"):
        mip_codec.decode_infer_request(payload)
    with contextlib.suppress(MipError):
        mip_items.decode_tensor(memoryview(struct.pack("!BBHL", 13, 1, 0, 2**32 - 1)), "i")
    with pytest.raises(MipError, match="needs at least"):
        mip_items.decode_tensor(memoryview(struct.pack("!BBHL", 13, 1, 0, 2**32 - 1)), "i")
    assert np.prod([]) == 1  # a 0-d TENSOR holds one element


def test_mip_items_may_not_decode_to_more_than_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each 8x8 RGB PNG decodes to 192 bytes; a small file can claim 64 Mpx.
    monkeypatch.setattr(mip_batch, "MAX_DECODED_BYTES", 1000)
    picture = next(model for model in seeds.models() if model.name == "picture")
    frame = encode_request([[(ItemType.IMAGE, seeds._png())]] * 6)
    request = mip_codec.decode_infer_request(frame[8:])
    binding = mip_batch.bind(picture, 1)
    with pytest.raises(MipError, match="decode to more than 1000 bytes") as caught:
        mip_batch.plan(binding, request)
    assert caught.value.code is ErrorCode.MEMORY
    monkeypatch.setattr(mip_batch, "MAX_DECODED_BYTES", 1200)
    assert mip_batch.plan(binding, request)[0].inputs["image"].shape == (6, 8, 8, 3)
