"""GraphPipe codec: round trips for every type, and hostile buffers."""

from __future__ import annotations

import contextlib
import struct
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, spec
from appliance.errors import ApplianceError, ErrorCode, error_from_code
from appliance.protocols.graphpipe import codec
from appliance.protocols.graphpipe.errors import (
    DecodeError,
    GraphPipeCode,
    GraphPipeError,
    from_appliance,
)
from appliance.protocols.graphpipe.request import InferRequest, MetadataRequest
from appliance.protocols.graphpipe.wire import describe, metadata_json
from tests.unit.test_graphpipe_encoder import (
    NUMPY_BY_TYPE,
    WT,
    decode_infer_response,
    decode_metadata_response,
    encode_infer_request,
    encode_metadata_request,
)

NUMERIC = [np.dtype(name) for name in NUMPY_BY_TYPE.values()]


def decode_one(body: bytes) -> Tensor:
    request = codec.decode_request(body)
    assert isinstance(request, InferRequest)
    assert len(request.inputs) == 1
    return codec.to_tensor(request.inputs[0], "input0")


def stock_client(buf: bytes) -> tuple[list[Any], list[dict[str, Any]]]:
    from graphpipe import convert

    return convert.deserialize_infer_response(buf)  # type: ignore[no-any-return]


# -- round trips ---------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hnp.arrays(
        st.sampled_from(NUMERIC),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_every_numeric_type_decodes_and_encodes_unchanged(array: np.ndarray[Any, Any]) -> None:
    tensor = decode_one(encode_infer_request([array]))
    assert tensor.dtype is not DType.BYTES
    np.testing.assert_array_equal(tensor.array(), array, strict=True)
    outputs, errors = decode_infer_response(codec.encode_infer_response([tensor]))
    assert errors == []
    np.testing.assert_array_equal(outputs[0][1], array, strict=True)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        object,
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
        elements=st.binary(max_size=12),
    )
)
def test_strings_decode_and_encode_unchanged(array: np.ndarray[Any, Any]) -> None:
    tensor = decode_one(encode_infer_request([WT(12, array.shape, strings=list(array.flat))]))
    assert tensor.dtype is DType.BYTES
    assert tensor.array().tolist() == array.tolist()
    outputs, _ = decode_infer_response(codec.encode_infer_response([tensor]))
    assert outputs[0][0] == 12
    assert outputs[0][1].tolist() == array.tolist()


def test_the_stock_client_reads_every_type_and_empty_and_0d_tensors() -> None:
    arrays: list[Any] = [np.arange(3, dtype=d) for d in NUMERIC]
    arrays += [np.zeros((0, 3), np.float32), np.array(7, np.int16), np.array([b"a", b"\x00b"])]
    tensors = [Tensor.from_array(a) for a in arrays]
    got, errors = stock_client(codec.encode_infer_response(tensors))
    assert errors == []
    for sent, back in zip(arrays, got, strict=True):
        assert back.shape == sent.shape
        assert back.tolist() == sent.tolist()


def test_large_replies_splice_every_data_vector_in_place() -> None:
    # Past 1 MiB the builder is mmap-backed and data vectors are joined in.
    arrays: list[Any] = [
        np.random.default_rng(1).random((3, 100_000)),
        np.array([b"x" * 10, b"yz"]),
        np.arange(5, dtype=np.int16),
        np.random.default_rng(2).random(300_000).astype(np.float32),
    ]
    got, errors = stock_client(codec.encode_infer_response([Tensor.from_array(a) for a in arrays]))
    assert errors == []
    for sent, back in zip(arrays, got, strict=True):
        np.testing.assert_array_equal(back, sent)


def test_bool_outputs_travel_as_uint8() -> None:
    outputs, _ = decode_infer_response(
        codec.encode_infer_response([Tensor.from_array(np.array([True, False]))])
    )
    assert outputs[0][0] == 1
    assert outputs[0][1].tolist() == [1, 0]


def test_unaligned_float64_data_is_read_correctly() -> None:
    # Pad the config until the data vector starts 4 bytes off an 8-byte boundary.
    values = np.array([1.5, -2.25, 1e300], np.float64)
    for pad in range(8):
        body = encode_infer_request([values], config=" " * pad)
        start = body.index(values.tobytes())
        if start % 8 == 4:
            break
    else:
        pytest.fail("no padding put the data off alignment")
    tensor = decode_one(body)
    assert not tensor.array().flags.aligned
    assert tensor.array().tolist() == values.tolist()


def test_error_response_is_what_the_stock_client_raises() -> None:
    error = GraphPipeError(GraphPipeCode.UNKNOWN_INPUT, "model m has no input named 'x'")
    outputs, errors = stock_client(codec.encode_error_response(error))
    assert outputs == []
    assert errors == [{"code": 4, "message": b"model m has no input named 'x'"}]


# -- requests ------------------------------------------------------------------


def test_names_and_config_are_decoded() -> None:
    body = encode_infer_request([np.zeros(1)], ["a"], ["y", ""], config='{"k": 1}')
    request = codec.decode_request(body)
    assert isinstance(request, InferRequest)
    assert request.input_names == ["a"]
    assert request.output_names == ["y", ""]
    assert request.config == b'{"k": 1}'


@pytest.mark.parametrize("req_type", [0, 2, 7, 255])
def test_any_request_but_infer_asks_for_metadata(req_type: int) -> None:
    assert codec.decode_request(encode_metadata_request(req_type)) == MetadataRequest()


@pytest.mark.parametrize(
    ("wire_tensor", "code"),
    [
        (WT(0, [1], b"\x00"), GraphPipeCode.UNSUPPORTED_TYPE),
        (WT(13, [1], b"\x00"), GraphPipeCode.UNSUPPORTED_TYPE),
        (WT(10, [3], b"\x00" * 8), GraphPipeCode.DATA_LENGTH),
        (WT(10, [2]), GraphPipeCode.DATA_LENGTH),
        (WT(10, [1], b"\x00" * 4, [b"x"]), GraphPipeCode.DATA_LENGTH),
        (WT(12, [2], strings=[b"x"]), GraphPipeCode.DATA_LENGTH),
        (WT(12, [1], b"\x00", [b"x"]), GraphPipeCode.DATA_LENGTH),
        (WT(1, [-1], b""), GraphPipeCode.BAD_SHAPE),
        (WT(1, [1] * 33, b"\x00"), GraphPipeCode.BAD_SHAPE),
        (WT(1, [0, 1 << 40, 1 << 40], b""), GraphPipeCode.BAD_SHAPE),
        (WT(8, [1 << 61], b""), GraphPipeCode.BAD_SHAPE),
    ],
)
def test_bad_tensors_get_their_own_codes(wire_tensor: WT, code: GraphPipeCode) -> None:
    with pytest.raises(GraphPipeError) as raised:
        decode_one(encode_infer_request([wire_tensor]))
    assert raised.value.code is code


def test_empty_and_0d_tensors_without_data_vectors() -> None:
    assert decode_one(encode_infer_request([WT(10, [0, 4])])).shape == (0, 4)
    scalar = decode_one(encode_infer_request([WT(6, [], struct.pack("<i", -3))]))
    assert scalar.array().shape == ()
    assert int(scalar.array()) == -3


# -- hostile buffers -----------------------------------------------------------


VALID = encode_infer_request(
    [np.arange(4, dtype=np.int32), np.array([b"ab", b"c"])], ["x", "y"], ["z"], config="{}"
)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00",
        b"garbage!",
        VALID[:-3],
        VALID[: len(VALID) // 2],
        struct.pack("<I", 1 << 31) + VALID[4:],
        b"\xff" * 64,
    ],
)
def test_malformed_bodies_raise_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError):
        codec.decode_request(body)


def test_infer_tag_without_its_table_is_malformed() -> None:
    # Request{req_type=1} with no req field: vtable of 3 entries, slot 1 absent.
    vtable = struct.pack("<HHHH", 8, 8, 4, 0)
    table = struct.pack("<i", 8) + b"\x01\x00\x00\x00"
    body = struct.pack("<I", 4 + len(vtable)) + vtable + table
    with pytest.raises(DecodeError, match="holds none"):
        codec.decode_request(body)


def test_a_huge_vector_length_is_refused_before_anything_is_allocated() -> None:
    body = bytearray(encode_infer_request([WT(12, [1], strings=[b"abcdef"])]))
    at = body.index(b"abcdef") - 4
    struct.pack_into("<I", body, at, 0xFFFFFFF0)
    with pytest.raises(DecodeError, match="lies outside"):
        codec.decode_request(bytes(body))


def test_tensors_sharing_their_data_cannot_multiply_memory() -> None:
    # Point many string_val entries at one big string: the decoded copies
    # would outgrow the body, so the verifier refuses it.
    body = bytearray(encode_infer_request([WT(12, [4], strings=[b"x" * 100, b"", b"", b""])]))
    big = body.index(b"x" * 100) - 4
    assert isinstance(codec.decode_request(bytes(body)), InferRequest)
    for slot in _string_offset_slots(bytes(body)):
        struct.pack_into("<I", body, slot, big - slot)
    with pytest.raises(DecodeError, match="overlap"):
        codec.decode_request(bytes(body))


def _string_offset_slots(body: bytes) -> list[int]:
    """Return where the string_val offsets of the first tensor are stored."""
    from appliance._generated.graphpipe import InferRequest as fb_infer_request
    from appliance._generated.graphpipe import Request as fb_request

    table = fb_request.Request.GetRootAs(body, 0).Req()
    infer = fb_infer_request.InferRequest()
    infer.Init(table.Bytes, table.Pos)
    tensor = infer.InputTensors(0)
    start = tensor._tab.Vector(tensor._tab.Offset(10))
    return [start + 4 * i for i in range(tensor.StringValLength())]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_decode_error(body: bytes) -> None:
    _decode_anything(body)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_requests_decode_or_raise_decode_error(data: st.DataObject) -> None:
    body = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    _decode_anything(bytes(body[:cut]))


def _decode_anything(body: bytes) -> None:
    try:
        request = codec.decode_request(body)
    except DecodeError:
        return
    if isinstance(request, InferRequest):
        for index, tensor in enumerate(request.inputs):
            with contextlib.suppress(GraphPipeError):
                codec.to_tensor(tensor, f"input{index}").array()


# -- errors and metadata -------------------------------------------------------


def test_every_appliance_error_maps_to_its_own_code() -> None:
    codes = set()
    for code in ErrorCode:
        if code is ErrorCode.OK:
            continue
        error: ApplianceError = error_from_code(code, "m")
        mapped = from_appliance(error)
        assert mapped.message == "m"
        codes.add(mapped.code)
    assert len(codes) == len(ErrorCode) - 1


def test_metadata_of_a_declared_and_a_generic_model() -> None:
    declared = ModelMetadata(
        "m", ("1",), "python", (spec("a", "BOOL", [-1, 3]),), (spec("s", "BYTES", [2]),), 4
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        response = decode_metadata_response(codec.encode_metadata_response(describe(declared)))
    assert (response.Name(), response.Version(), response.Server()) == (b"m", b"1", b"appliance")
    io = response.Inputs(0)
    assert (io.Name(), io.ShapeAsNumpy().tolist(), io.Type()) == (b"a", [-1, 3], 1)
    assert response.Outputs(0).Type() == 12
    generic = ModelMetadata("echo", ("1",), "python", None, None, 0)
    response = decode_metadata_response(codec.encode_metadata_response(describe(generic)))
    assert response.InputsLength() == response.OutputsLength() == 0
    assert not response.InputsIsNone()
    assert b"Generic" in response.Description()
    assert b'"Inputs": []' in metadata_json(describe(generic))
