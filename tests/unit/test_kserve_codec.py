"""The KServe REST codec: JSON and binary tensors, content encodings, fuzzing.

Only the pure REST codec is tested here. The protobuf codec is covered over
the wire in tests/system/test_kserve_grpc.py: importing it would define the
``inference.*`` protobuf names that tritonclient defines too.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import zlib
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from appliance.core.dtypes import DType, from_numpy, pack_bytes, to_numpy
from appliance.core.tensor import Tensor
from appliance.errors import TooLarge
from appliance.protocols.kserve import codec, encoding
from appliance.protocols.kserve.errors import DecodeError
from appliance.protocols.kserve.inference import OutputData, ShmRef

NUMERIC = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="<"),
    hnp.unsigned_integer_dtypes(endianness="<"),
    hnp.floating_dtypes(endianness="<", sizes=(16, 32, 64)),
)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
arrays = NUMERIC.flatmap(lambda dtype: hnp.arrays(dtype, SHAPES))
finite_arrays = NUMERIC.flatmap(
    lambda dtype: (
        hnp.arrays(dtype, SHAPES, elements={"allow_nan": False, "allow_infinity": False})
        if dtype.kind == "f"
        else hnp.arrays(dtype, SHAPES)
    )
)
byte_lists = st.lists(st.binary(max_size=12), max_size=8)


def request_body(tensors: dict[str, Any], binary: bool) -> tuple[bytes, int | None]:
    """Build an inference request the way tritonclient does."""
    inputs, blobs = [], []
    for name, array in tensors.items():
        dtype = from_numpy(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": dtype.value, "shape": list(array.shape)}
        if binary:
            blob = pack_bytes(array) if dtype is DType.BYTES else array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif dtype is DType.BYTES:
            entry["data"] = [x.decode() for x in array.reshape(-1)]
        else:
            entry["data"] = array.tolist()
        inputs.append(entry)
    header = orjson.dumps({"inputs": inputs})
    return header + b"".join(blobs), (len(header) if blobs else None)


def decoded(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    request = codec.decode_infer_request(body, header_length, "m")
    assert all(item.data is not None for item in request.inputs)
    return {item.name: item.data.array() for item in request.inputs if item.data is not None}


def same(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    return got.tobytes() == want.tobytes() if got.dtype != object else got.tolist() == want.tolist()


@given(arrays)
def test_binary_tensors_round_trip(array: np.ndarray) -> None:
    got = decoded(*request_body({"x": array}, binary=True))["x"]
    assert same(got, array)


@given(finite_arrays)
def test_json_tensors_round_trip(array: np.ndarray) -> None:
    got = decoded(*request_body({"x": array}, binary=False))["x"]
    assert same(got, array)


@given(byte_lists, st.booleans())
def test_bytes_round_trip_in_binary_and_json(items: list[bytes], binary: bool) -> None:
    if not binary:
        items = [item.decode("utf-8", "replace").encode() for item in items]
    array = np.array([*items, b""], dtype=object)[: len(items)]
    got = decoded(*request_body({"s": array}, binary))["s"]
    assert got.tolist() == items


def test_mixed_json_and_binary_inputs_keep_their_order() -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([b"x\x00y", b""], dtype=object)
    c = np.array([[1.5, 2.5]], dtype=np.float64)
    body_b, _ = request_body({"b": b}, binary=True)
    header = orjson.loads(body_b[: body_b.index(b"}]}") + 3])
    inputs = [
        {"name": "a", "datatype": "INT32", "shape": [2, 3], "data": [[0, 1, 2], [3, 4, 5]]},
        header["inputs"][0],
        {"name": "c", "datatype": "FP64", "shape": [1, 2], "parameters": {"binary_data_size": 16}},
    ]
    json_part = orjson.dumps({"inputs": inputs, "id": "7", "parameters": {"k": 1}})
    blob_b = pack_bytes(b)
    request = codec.decode_infer_request(json_part + blob_b + c.tobytes(), len(json_part), "m", "1")
    assert (request.id, request.version, request.model_parameters()) == ("7", "1", {"k": 1})
    got = {item.name: item.data.array() for item in request.inputs if item.data is not None}
    assert same(got["a"], a)
    assert same(got["b"], b)
    assert same(got["c"], c)


def test_nested_and_flat_data_mean_the_same() -> None:
    for data in ([[1, 2], [3, 4]], [1, 2, 3, 4]):
        tensor = codec.tensor_from_json("x", DType.INT64, (2, 2), data)
        assert tensor.array().tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("dtype", "data", "words"),
    [
        (DType.INT8, [300], "do not fit INT8"),
        (DType.UINT8, [-1], "do not fit UINT8"),
        (DType.INT32, [1.5], "whole JSON numbers"),
        (DType.UINT64, [2**64], "does not fit UINT64"),
        (DType.BOOL, [1], "must be JSON booleans"),
        (DType.FP32, ["1"], "must be JSON numbers"),
        (DType.FP32, [[1], [2, 3]], "(nested) list of numbers"),
        (DType.BYTES, [1], "must be JSON strings"),
        (DType.FP32, [1, 2], "2 values in data do not match shape [3]"),
    ],
)
def test_bad_json_data_is_refused(dtype: DType, data: Any, words: str) -> None:
    shape = (3,) if "match shape" in words else (len(data),)
    with pytest.raises(DecodeError) as caught:
        codec.tensor_from_json("x", dtype, shape, data)
    assert words in caught.value.message


def test_large_unsigned_integers_stay_exact() -> None:
    tensor = codec.tensor_from_json("x", DType.UINT64, (2,), [0, 2**64 - 1])
    assert tensor.array().tolist() == [0, 2**64 - 1]


@pytest.mark.parametrize("size", [2, 100])  # either side of the codec's small-tensor path
@pytest.mark.parametrize("dtype", [DType.FP16, DType.FP32])
def test_a_nan_does_not_hide_a_value_too_large(dtype: DType, size: int) -> None:
    data = [float("nan")] * (size - 1) + [1e300]
    with pytest.raises(DecodeError) as caught:
        codec.tensor_from_json("x", dtype, (size,), data)
    assert "too large" in caught.value.message
    tensor = codec.tensor_from_json("x", dtype, (size,), [float("nan")] * size)
    assert np.isnan(tensor.array()).all()


@pytest.mark.parametrize("size", [3, 100])
def test_integers_out_of_range_are_refused_whatever_the_size(size: int) -> None:
    with pytest.raises(DecodeError) as caught:
        codec.tensor_from_json("x", DType.INT8, (size,), [0] * (size - 1) + [200])
    assert "values from 0 to 200 do not fit INT8" in caught.value.message


@pytest.mark.parametrize("dtype", [DType.UINT64, DType.INT64, DType.UINT8])
@pytest.mark.parametrize("data", [False, [True, False]])
def test_booleans_as_integer_data_decode(dtype: DType, data: Any) -> None:
    # Found by the property below: UINT64's range check overflowed on a
    # numpy bool (an OverflowError, a 500 over REST).
    shape = () if data is False else (2,)
    tensor = codec.tensor_from_json("x", dtype, shape, data)
    assert tensor.array().tolist() == (0 if data is False else [1, 0])


@pytest.mark.parametrize(
    ("body", "header_length", "words"),
    [
        (b"", None, "not valid JSON"),
        (b"[]", None, "must be a JSON object"),
        (b'{"inputs": {}}', None, '"inputs"'),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": []}]}',
            None,
            ">= 0",
        ),
        (b'{"inputs": [{"name": "x", "datatype": "X", "shape": [1], "data": [1]}]}', None, "'X'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}', None, "has no data"),
        (b'{"inputs": []}xx', 14, "2 bytes of binary data"),
        (b'{"inputs": []}', 15, "does not fit"),
        (b'{"inputs": [], "id": 5}', None, "id must be a string"),
        (b'{"inputs": [], "outputs": [{"parameters": {}}]}', None, "with a name"),
        (
            b'{"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": 3}}]}',
            None,
            "classification",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]},'
            b' {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}',
            None,
            "given more than once",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "parameters":'
            b' {"shared_memory_region": "r"}}]}',
            None,
            "must be given together",
        ),
    ],
)
def test_malformed_requests_name_the_problem(
    body: bytes, header_length: int | None, words: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        codec.decode_infer_request(body, header_length, "m")
    assert words in caught.value.message


def test_shared_memory_inputs_and_outputs_are_references() -> None:
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 64},
                }
            ],
            "outputs": [
                {
                    "name": "y",
                    "parameters": {
                        "binary_data": False,
                        "shared_memory_region": "out",
                        "shared_memory_byte_size": 64,
                        "shared_memory_offset": 64,
                    },
                }
            ],
        }
    )
    request = codec.decode_infer_request(body, None, "m")
    assert request.inputs[0].shm == ShmRef("in", 64, 0)
    assert request.inputs[0].data is None
    assert request.outputs is not None
    assert request.outputs[0].shm == ShmRef("out", 64, 64)


@given(st.binary(max_size=300), st.one_of(st.none(), st.integers(-5, 400)))
@settings(max_examples=300)
def test_any_bytes_decode_or_raise_decode_error(body: bytes, header_length: int | None) -> None:
    with contextlib.suppress(DecodeError):
        codec.decode_infer_request(body, header_length, "m")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
tensor_docs = st.fixed_dictionaries(
    {"name": st.text(max_size=3)},
    optional={
        "datatype": st.sampled_from([d.value for d in DType]) | json_values,
        "shape": st.lists(st.integers(-1, 4), max_size=3) | json_values,
        "data": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(
                [
                    "binary_data_size",
                    "shared_memory_region",
                    "shared_memory_byte_size",
                    "binary_data",
                ]
            ),
            json_values,
        ),
    },
)


@given(
    st.lists(tensor_docs, max_size=3),
    st.lists(tensor_docs, max_size=2),
    json_values,
    st.binary(max_size=40),
)
@settings(max_examples=300)
def test_any_request_document_decodes_or_raises_decode_error(
    inputs: list[Any], outputs: list[Any], parameters: Any, tail: bytes
) -> None:
    doc = {"inputs": inputs, "outputs": outputs, "parameters": parameters}
    header = json.dumps(doc).encode()
    with contextlib.suppress(DecodeError):
        codec.decode_infer_request(header + tail, len(header) if tail else None, "m")


def parse_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    header = orjson.loads(body[:header_length] if header_length else body)
    at = header_length or 0
    arrays = {}
    for output in header["outputs"]:
        dtype = DType(output["datatype"])
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            arrays[output["name"]] = Tensor(dtype, output["shape"], body[at : at + size]).array()
            at += size
        elif dtype is DType.BYTES:
            data = [x.encode() for x in output["data"]]
            arrays[output["name"]] = np.array(data, dtype=object).reshape(output["shape"])
        else:
            data = np.array(output["data"], dtype=to_numpy(dtype))
            arrays[output["name"]] = data.reshape(output["shape"])
    return arrays


@given(finite_arrays, st.booleans())
def test_responses_round_trip(array: np.ndarray, binary: bool) -> None:
    tensor = Tensor.from_array(array)
    body, header_length = codec.encode_infer_response(
        "m", "1", "", [OutputData("y", tensor, binary)]
    )
    assert (header_length is not None) == binary
    got = parse_response(body, header_length)["y"]
    assert got.shape == array.shape
    assert np.array_equal(got.astype(array.dtype), array)


def test_response_header_and_shared_memory_outputs() -> None:
    text = Tensor.from_array(np.array([b"a\x00b", "é".encode()], dtype=object))
    number = Tensor.from_array(np.array([1, 2], dtype=np.int32))
    outputs = [
        OutputData("t", text, False),
        OutputData("n", number, True),
        OutputData("s", number, True, ShmRef("r", 8)),
    ]
    body, header_length = codec.encode_infer_response("m", "1", "id9", outputs)
    assert header_length is not None
    header = orjson.loads(body[:header_length])
    assert (header["model_name"], header["model_version"], header["id"]) == ("m", "1", "id9")
    assert header["outputs"][0]["data"] == ["a\x00b", "é"]
    assert b'"a\\u0000b"' in body
    assert header["outputs"][1]["parameters"] == {"binary_data_size": 8}
    assert header["outputs"][2] == {"name": "s", "datatype": "INT32", "shape": [2]}
    assert body[header_length:] == number.raw().tobytes()


def test_non_utf8_output_cannot_be_json() -> None:
    tensor = Tensor.from_array(np.array([b"\xff"], dtype=object))
    with pytest.raises(DecodeError, match="not UTF-8"):
        codec.encode_infer_response("m", "1", "", [OutputData("y", tensor, False)])


@pytest.mark.parametrize("name", ["gzip", "deflate"])
@given(data=st.binary(max_size=2000))
def test_content_encodings_round_trip(name: str, data: bytes) -> None:
    assert encoding.decode_content(encoding.encode_content(data, name), name, 1 << 20) == data


def test_content_decoding_accepts_raw_deflate_and_checks_limits() -> None:
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    stream = raw.compress(b"hello") + raw.flush()
    assert encoding.decode_content(stream, "deflate", 100) == b"hello"
    assert encoding.decode_content(b"plain", None, 100) == b"plain"
    with pytest.raises(TooLarge):
        encoding.decode_content(gzip.compress(b"\x00" * 10_000), "gzip", 1000)
    with pytest.raises(DecodeError, match="unsupported Content-Encoding"):
        encoding.decode_content(b"x", "br", 100)
    with pytest.raises(DecodeError, match="not valid gzip"):
        encoding.decode_content(gzip.compress(b"abc")[:-4], "gzip", 100)


@given(st.binary(max_size=200), st.sampled_from(["gzip", "deflate", "identity", "zstd"]))
def test_any_body_decompresses_or_raises_our_errors(body: bytes, name: str) -> None:
    with contextlib.suppress(DecodeError, TooLarge):
        encoding.decode_content(body, name, 1000)


@pytest.mark.parametrize(
    ("header", "chosen"),
    [
        (None, None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("br, deflate;q=0.5", "deflate"),
        ("gzip;q=0, deflate", "deflate"),
        ("identity", None),
    ],
)
def test_accept_encoding(header: str | None, chosen: str | None) -> None:
    assert encoding.choose_encoding(header) == chosen
