"""GRPS codecs: JSON and protobuf round trips, GRPS's JSON rendering, hostile input."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.protocols.grps import codec, pbcodec
from appliance.protocols.grps.errors import GrpsError
from appliance.protocols.grps.payload import Kind, MapField, Payload

# Every element type GRPS can carry, with the numpy type it decodes to.
GRPS_NUMERIC = {
    "DT_UINT8": np.dtype("<u1"),
    "DT_INT8": np.dtype("<i1"),
    "DT_INT16": np.dtype("<i2"),
    "DT_INT32": np.dtype("<i4"),
    "DT_INT64": np.dtype("<i8"),
    "DT_FLOAT16": np.dtype("<f2"),
    "DT_FLOAT32": np.dtype("<f4"),
    "DT_FLOAT64": np.dtype("<f8"),
}
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def numeric_arrays() -> st.SearchStrategy[np.ndarray[Any, Any]]:
    return st.sampled_from(list(GRPS_NUMERIC.values())).flatmap(
        lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=3, max_side=4))
    )


def string_arrays() -> st.SearchStrategy[np.ndarray[Any, Any]]:
    return hnp.array_shapes(min_dims=1, max_dims=2, max_side=3).flatmap(
        lambda shape: st.lists(
            st.text(max_size=6).map(str.encode),
            min_size=int(np.prod(shape)),
            max_size=int(np.prod(shape)),
        ).map(lambda items: np.array([*items, None], dtype=object)[:-1].reshape(shape))
    )


def gtensors(*arrays: np.ndarray[Any, Any]) -> Payload:
    return Payload(
        Kind.GTENSORS, tensors=[(f"t{i}", Tensor.from_array(a)) for i, a in enumerate(arrays)]
    )


def same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    if a.dtype == object:
        return a.shape == b.shape and b.dtype == object and a.tolist() == b.tolist()
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def reply_as_request(body: bytes) -> Payload:
    """Read a reply back as a request: GRPS replies and requests are one message."""
    return codec.decode_json_request(body)


# -- round trips ---------------------------------------------------------------


@SETTINGS
@given(st.one_of(numeric_arrays(), string_arrays()))
# The largest FP32 in its shortest form (3.4028235e+38) is a hair above it as a double.
@example(np.array([np.finfo(np.float32).max, np.finfo(np.float32).min], np.float32))
def test_json_reply_decodes_back_to_the_same_tensor(array: np.ndarray[Any, Any]) -> None:
    decoded = reply_as_request(codec.encode_json_reply(gtensors(array)))
    assert decoded.kind is Kind.GTENSORS
    name, tensor = decoded.tensors[0]
    assert name == "t0"
    assert same(tensor.array(), array)


@SETTINGS
@given(st.one_of(numeric_arrays(), string_arrays()))
def test_protobuf_round_trip(array: np.ndarray[Any, Any]) -> None:
    message = pbcodec.encode_message(gtensors(array))
    wire = message.SerializeToString()
    decoded = pbcodec.decode_message(pbcodec.GrpsMessage.FromString(wire))
    assert same(decoded.tensors[0][1].array(), array)


@SETTINGS
@given(st.one_of(numeric_arrays(), string_arrays()))
def test_json_rendering_matches_protobufs_own(array: np.ndarray[Any, Any]) -> None:
    # SPEC: PROTOCOL-FACTS §3.2 — GRPS renders with MessageToJson and proto
    # field names; the orjson fast path must say the same thing.
    payload = gtensors(array)
    ours = json.loads(codec.encode_json_reply(payload))
    theirs = json.loads(
        json_format.MessageToJson(pbcodec.encode_message(payload), preserving_proto_field_name=True)
    )
    # Float32 values may be written with different digits (7.6e-44 and
    # 7.56701e-44 are the same float32): compare them as float32, by their
    # text so that NaN equals NaN.
    for side in (ours, theirs):
        for tensor in side.get("gtensors", {}).get("tensors", []):
            if "flat_float32" in tensor:
                values = np.asarray(tensor["flat_float32"], np.float32)
                tensor["flat_float32"] = [str(value) for value in values]
    assert ours == theirs


def test_rendering_follows_proto3_json_rules() -> None:
    payload = gtensors(np.array([1, -2], dtype=np.int64), np.array([np.nan, np.inf], np.float32))
    doc = orjson.loads(codec.encode_json_reply(payload))
    assert doc["status"] == {"code": 200, "msg": "OK", "status": "SUCCESS"}
    first, second = doc["gtensors"]["tensors"]
    assert first == {"name": "t0", "dtype": "DT_INT64", "shape": [2], "flat_int64": ["1", "-2"]}
    assert second["flat_float32"] == ["NaN", "Infinity"]
    scalar = orjson.loads(codec.encode_json_reply(gtensors(np.array(0, dtype=np.int32))))
    # Default values are left out: a 0-d tensor has no shape (and reads back as 1-D).
    assert scalar["gtensors"]["tensors"][0] == {
        "name": "t0",
        "dtype": "DT_INT32",
        "flat_int32": [0],
    }
    empty = orjson.loads(codec.encode_json_reply(gtensors(np.zeros((0, 2), np.float32))))
    assert empty["gtensors"]["tensors"][0] == {"name": "t0", "dtype": "DT_FLOAT32", "shape": [0, 2]}
    ((_name, back),) = reply_as_request(codec.encode_json_reply(gtensors(np.zeros((0, 2))))).tensors
    assert back.shape == (0, 2)


def test_types_grps_lacks_travel_in_a_wider_one() -> None:
    payload = gtensors(
        np.array([True, False]), np.array([65535], np.uint16), np.array([7], np.uint32)
    )
    tensors = orjson.loads(codec.encode_json_reply(payload))["gtensors"]["tensors"]
    assert [t["dtype"] for t in tensors] == ["DT_UINT8", "DT_INT32", "DT_INT64"]
    assert tensors[0]["flat_uint8"] == [1, 0]
    assert tensors[2]["flat_int64"] == ["7"]
    too_big = gtensors(np.array([1 << 63], np.uint64))
    with pytest.raises(GrpsError, match="UINT64"):
        codec.encode_json_reply(too_big)
    with pytest.raises(GrpsError, match="UINT64"):
        pbcodec.encode_message(too_big)


def test_gmap_renders_bytes_as_base64_and_int64_as_strings() -> None:
    gmap = {MapField.S_B: {"b": b"\x00\xff"}, MapField.S_I64: {"n": 5}, MapField.S_S: {"s": "x"}}
    doc = orjson.loads(codec.encode_json_reply(Payload(Kind.GMAP, gmap=gmap)))
    assert doc["gmap"] == {"s_s": {"s": "x"}, "s_b": {"b": "AP8="}, "s_i64": {"n": "5"}}
    back = reply_as_request(codec.encode_json_reply(Payload(Kind.GMAP, gmap=gmap)))
    assert back.gmap == gmap


def test_non_utf8_strings_are_a_clear_failure() -> None:
    payload = gtensors(np.array([b"\xff"], dtype=object))
    with pytest.raises(GrpsError, match="not UTF-8"):
        codec.encode_json_reply(payload)


# -- decoding requests ---------------------------------------------------------


def decode(doc: Any) -> Payload:
    return codec.decode_json_request(json.dumps(doc).encode())


def test_the_docs_gtensors_example_decodes_with_flat_double() -> None:
    # SPEC: grps.md "Infer接口" — the documented request, flat_double and all.
    payload = decode(
        {
            "gtensors": {
                "tensors": [
                    {
                        "name": "in1",
                        "dtype": "DT_INT32",
                        "shape": [3, 2],
                        "flat_int32": [1, 2, 3, 4, 5, 6],
                    },
                    {
                        "name": "in2",
                        "dtype": "DT_FLOAT64",
                        "shape": [3, 3],
                        "flat_double": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                    },
                ]
            }
        }
    )
    (n1, t1), (n2, t2) = payload.tensors
    assert (n1, t1.dtype, t1.shape) == ("in1", DType.INT32, (3, 2))
    assert (n2, t2.dtype, t2.shape) == ("in2", DType.FP64, (3, 3))
    assert t2.array()[2, 2] == 9.0


@pytest.mark.parametrize(
    ("tensor", "dtype", "values"),
    [
        ({"dtype": 7, "flat_float32": [1, 2]}, DType.FP32, [1, 2]),
        ({"flatFloat32": [1.5]}, DType.FP32, [1.5]),
        ({"dtype": "DT_INT64", "flat_int64": ["9007199254740993", 2]}, DType.INT64, [2**53 + 1, 2]),
        ({"dtype": "DT_FLOAT64", "flat_float64": ["NaN", "-Infinity"]}, DType.FP64, None),
        ({"dtype": "DT_STRING", "flat_string": ["a", ""]}, DType.BYTES, [b"a", b""]),
        ({"dtype": "DT_UINT8", "flat_uint8": [0, 255]}, DType.UINT8, [0, 255]),
        ({"dtype": "DT_INT32", "flat_int32": [1.0, 2]}, DType.INT32, [1, 2]),
    ],
)
def test_tensor_forms_protobuf_json_allows(
    tensor: dict[str, Any], dtype: DType, values: list[Any] | None
) -> None:
    ((_name, decoded),) = decode({"gtensors": {"tensors": [tensor]}}).tensors
    assert decoded.dtype is dtype
    if values is not None:
        assert decoded.array().tolist() == values


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "JSON object"),
        ({}, "carries no data"),
        ({"model": "echo"}, "carries no data"),
        ({"str_data": "a", "gmap": {}}, "one payload"),
        ({"str_data": 5}, "str_data must be a string"),
        ({"model": 3, "str_data": "a"}, "model must be a string"),
        ({"bin_data": "!!"}, "base64"),
        ({"ndarray": [[1, 2], [3]]}, "rectangular"),
        ({"ndarray": [["a"]]}, "numbers only"),
        ({"gtensors": []}, "gtensors must be an object"),
        ({"gtensors": {"tensors": []}}, "no tensors"),
        ({"gtensors": {"tensors": [5]}}, "GenericTensor object"),
        ({"gtensors": {"tensors": [{"dtype": "DT_BOOL", "flat_int32": [1]}]}}, "unknown dtype"),
        ({"gtensors": {"tensors": [{"dtype": 12, "flat_int32": [1]}]}}, "unknown dtype"),
        ({"gtensors": {"tensors": [{"shape": [1]}]}}, "no dtype"),
        (
            {"gtensors": {"tensors": [{"dtype": "DT_FLOAT32", "flat_float64": [1.0]}]}},
            "carries its data in flat_float32, but flat_float64",
        ),
        (
            {"gtensors": {"tensors": [{"dtype": 4, "shape": [2, 2], "flat_int32": [1, 2, 3]}]}},
            "holds 4 elements but flat_int32 has 3",
        ),
        ({"gtensors": {"tensors": [{"dtype": 1, "flat_uint8": [256]}]}}, "out of range"),
        ({"gtensors": {"tensors": [{"dtype": 2, "flat_int8": [-129]}]}}, "out of range"),
        ({"gtensors": {"tensors": [{"dtype": 4, "flat_int32": [1.5]}]}}, "whole numbers"),
        ({"gtensors": {"tensors": [{"dtype": 4, "flat_int32": [True]}]}}, "not a number"),
        ({"gtensors": {"tensors": [{"dtype": 4, "flat_int32": ["x"]}]}}, "not a number"),
        ({"gtensors": {"tensors": [{"dtype": 5, "flat_int64": [2**64]}]}}, "out of range"),
        ({"gtensors": {"tensors": [{"dtype": 7, "flat_float32": [1e39]}]}}, "out of range"),
        ({"gtensors": {"tensors": [{"dtype": 7, "flat_float32": [[1.0]]}]}}, "flat list"),
        ({"gtensors": {"tensors": [{"dtype": 9, "flat_string": [1]}]}}, "not a string"),
        ({"gtensors": {"tensors": [{"dtype": 4, "shape": [-1], "flat_int32": [1]}]}}, "shape"),
        ({"gmap": {"s_i32": {"a": "x"}}}, "gmap"),
        ({"gmap": []}, "gmap"),
    ],
)
def test_bad_requests_are_400_with_a_message(doc: Any, message: str) -> None:
    with pytest.raises(GrpsError, match=message) as caught:
        decode(doc)
    assert caught.value.code == 400


def test_the_payload_kinds_decode() -> None:
    assert decode({"str_data": "", "model": "m-1"}).data == ""
    assert decode({"strData": "x"}).model == ""
    assert decode({"bin_data": "AP8"}).data == b"\x00\xff"  # unpadded, as proto3 JSON allows
    array = decode({"ndarray": [[1, 2, 3], [4, 5, 6]]}).array
    assert array is not None
    assert array.shape == (2, 3)
    assert array.dtype == np.float64
    gmap = decode({"gmap": {"s_f": {"x": 1.5}, "s_b": {"b": "AP8="}, "s_i64": {"n": "7"}}}).gmap
    assert gmap == {
        MapField.S_B: {"b": b"\x00\xff"},
        MapField.S_I64: {"n": 7},
        MapField.S_F: {"x": 1.5},
    }


# -- hostile input ---------------------------------------------------------------


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
payload_keys = st.sampled_from(
    [
        "str_data",
        "bin_data",
        "gtensors",
        "ndarray",
        "gmap",
        "model",
        "tensors",
        "dtype",
        "shape",
        "flat_int32",
        "flat_double",
        "flat_string",
        "name",
        "s_b",
        "s_i64",
    ]
)
grps_like = st.recursive(
    json_values,
    lambda inner: st.dictionaries(payload_keys, inner, max_size=4) | st.lists(inner, max_size=4),
    max_leaves=30,
)


def decode_code(action: Callable[[], object]) -> int | None:
    """Run a decoder; return None, or the code of the GrpsError it raised (nothing else)."""
    try:
        action()
    except GrpsError as ex:
        return ex.code
    return None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_our_error(body: bytes) -> None:
    assert decode_code(lambda: codec.decode_json_request(body)) in (None, 400)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grps_like)
def test_any_json_decodes_or_raises_our_error(doc: Any) -> None:
    assert decode_code(lambda: codec.decode_json_request(json.dumps(doc).encode())) in (None, 400)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_protobuf_bytes_decode_or_raise_our_error(wire: bytes) -> None:
    try:
        message = pbcodec.GrpsMessage.FromString(wire)
    except DecodeError:
        return  # grpc answers INTERNAL for an unparsable message before we see it
    assert decode_code(lambda: pbcodec.decode_message(message)) in (None, 400)


def test_protobuf_tensor_checks() -> None:
    pb = pbcodec.grps_pb2
    bad = pb.GrpsMessage()
    bad.gtensors.tensors.add(dtype=pb.DT_UINT8, flat_uint8=[300])
    with pytest.raises(GrpsError, match="out of range"):
        pbcodec.decode_message(bad)
    mixed = pb.GrpsMessage()
    mixed.gtensors.tensors.add(dtype=pb.DT_INT32, flat_float32=[1.0])
    with pytest.raises(GrpsError, match="carries its data in flat_int32"):
        pbcodec.decode_message(mixed)
    inferred = pb.GrpsMessage()
    inferred.gtensors.tensors.add(shape=[1, 2], flat_float64=[1.0, 2.0])
    ((_name, tensor),) = pbcodec.decode_message(inferred).tensors
    assert tensor.dtype is DType.FP64
    assert tensor.shape == (1, 2)
    with pytest.raises(GrpsError, match="no data"):
        pbcodec.decode_message(pb.GrpsMessage(model="echo"))


def test_the_float_fast_path_leaves_unusual_encodings_to_protobuf() -> None:
    tensor = pbcodec.grps_pb2.GenericTensor(name="x", dtype=7, shape=[2], flat_float32=[1.5, 2.5])
    canonical = tensor.SerializeToString()
    fast = pbcodec.packed_floats(canonical, "flat_float32")
    assert fast is not None
    assert fast.tolist() == [1.5, 2.5]
    built = pbcodec.float_tensor_bytes("x", 7, (2,), "flat_float32", np.array([1.5, 2.5]))
    assert built == canonical
    # Two packed runs, or unpacked fixed32 values, are valid protobuf but not
    # what protobuf writes: the fast path declines them.
    run = b"\x52\x04" + np.float32(1).tobytes()
    assert pbcodec.packed_floats(run + run, "flat_float32") is None
    assert pbcodec.packed_floats(b"\x55" + np.float32(1).tobytes(), "flat_float32") is None
    parsed = pbcodec.grps_pb2.GenericTensor.FromString(b"\x10\x07" + run + run)
    assert list(parsed.flat_float32) == [1.0, 1.0]
