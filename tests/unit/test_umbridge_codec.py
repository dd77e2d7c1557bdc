"""The UM-Bridge codec and error form, without a server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.core.dtypes import DType, to_numpy
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import spec
from appliance.errors import (
    BadRequest,
    DeadlineExceeded,
    InternalError,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    TooLarge,
    Unsupported,
    WorkerLost,
)
from appliance.protocols.umbridge import codec
from appliance.protocols.umbridge.codec import Feature, Unmappable, interface_of
from appliance.protocols.umbridge.errors import UmBridgeError, encode_error, from_appliance

SUPPORTS = {"predict": True, "gradient": True, "apply_jacobian": False, "apply_hessian": False}


def metadata(inputs: Any, outputs: Any, max_batch_size: int = 0) -> ModelMetadata:
    return ModelMetadata("m", ("1",), "python", inputs, outputs, max_batch_size, SUPPORTS)


BATCHED = interface_of(
    metadata(
        (spec("a", "INT32", [-1, 2, 2]), spec("b", "FP64", [-1, 1])),
        (spec("y", "FP32", [-1, 3]),),
        8,
    )
)


def test_sizes_leave_out_the_batch_dimension() -> None:
    assert BATCHED.input_sizes == (4, 1)
    assert BATCHED.output_sizes == (3,)
    assert BATCHED.batched
    assert BATCHED.supports(Feature.EVALUATE)
    assert BATCHED.supports(Feature.GRADIENT)
    assert not BATCHED.supports(Feature.APPLY_HESSIAN)


def test_unbatched_scalars_have_size_one() -> None:
    iface = interface_of(metadata((spec("s", "FP64", []),), (spec("t", "UINT8", [2, 3]),)))
    assert (iface.input_sizes, iface.output_sizes, iface.batched) == ((1,), (6,), False)


@pytest.mark.parametrize(
    ("inputs", "outputs", "batch", "reason"),
    [
        (None, None, 0, "generic"),
        ((), (spec("y", "FP64", [1]),), 0, "no inputs"),
        ((spec("x", "BYTES", [1]),), (spec("y", "FP64", [1]),), 0, "BYTES"),
        ((spec("x", "FP64", [-1, -1]),), (spec("y", "FP64", [-1, 1]),), 4, "no fixed size"),
        ((spec("x", "FP64", [-1]),), (spec("y", "FP64", [1]),), 0, "no fixed size"),
        ((spec("x", "FP64", [1]),), (spec("y", "FP64", [2, -1]),), 0, "tensor y"),
    ],
)
def test_models_without_fixed_numeric_vectors_do_not_map(
    inputs: Any, outputs: Any, batch: int, reason: str
) -> None:
    with pytest.raises(Unmappable, match=reason):
        interface_of(metadata(inputs, outputs, batch))


def test_inputs_are_shaped_as_one_row_of_a_batch() -> None:
    vectors = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.5])]
    inputs = codec.to_model_inputs(BATCHED, vectors)
    assert inputs["a"].dtype == np.int32
    assert inputs["a"].tolist() == [[[1, 2], [3, 4]]]
    assert inputs["b"].shape == (1, 1)


def test_outputs_flatten_to_float64_and_sizes_are_checked() -> None:
    (vector,) = codec.output_vectors(BATCHED, {"y": np.ones((1, 3), dtype=np.float32)})
    assert vector.dtype == np.float64
    assert vector.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(UmBridgeError, match="Model declared 3 but returned 4") as info:
        codec.output_vectors(BATCHED, {"y": np.ones((1, 4))})
    assert (info.value.status, info.value.type) == (500, "InvalidOutput")
    with pytest.raises(UmBridgeError, match="did not return its output y"):
        codec.output_vectors(BATCHED, {})


@pytest.mark.parametrize(
    ("dtype", "value"),
    [
        (DType.INT32, 1.5),
        (DType.INT32, 2.0**31),
        (DType.INT8, -129.0),
        (DType.UINT8, -1.0),
        (DType.UINT64, 2.0**64),
        (DType.INT64, 2.0**63),
        (DType.INT16, float("nan")),
        (DType.INT16, float("inf")),
        (DType.BOOL, 0.5),
        (DType.FP16, 1e6),
        (DType.FP32, 1e39),
    ],
)
def test_values_that_do_not_survive_the_dtype_are_refused(dtype: DType, value: float) -> None:
    with pytest.raises(UmBridgeError, match=r"element 1 = .* is not exactly representable") as info:
        codec.cast_exact(np.array([0.0, value]), dtype, "x")
    assert (info.value.status, info.value.type) == (400, "InvalidInput")


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        (DType.INT64, [-(2.0**63), 2.0**62]),
        (DType.UINT64, [0.0, 2.0**63]),
        (DType.INT8, [-128.0, 127.0]),
        (DType.BOOL, [0.0, 1.0]),
        (DType.FP32, [0.1, float("nan"), float("-inf")]),
        (DType.FP16, [65504.0]),
    ],
)
def test_edge_values_that_fit_are_kept(dtype: DType, values: list[float]) -> None:
    array = codec.cast_exact(np.array(values), dtype, "x")
    assert array.dtype == to_numpy(dtype)
    np.testing.assert_array_equal(array.astype(np.float64), np.array(values, dtype=to_numpy(dtype)))


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20))
def test_int32_values_round_trip_exactly(values: list[int]) -> None:
    array = codec.cast_exact(np.array(values, dtype=np.float64), DType.INT32, "x")
    assert array.tolist() == values


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """Return ("ok", result) or (error type, error): one property, two branches."""
    try:
        return "ok", call()
    except UmBridgeError as ex:
        return str(ex.type), ex


@given(st.binary(max_size=200))
def test_any_bytes_decode_to_an_object_or_raise_invalid_input(body: bytes) -> None:
    kind, result = outcome(lambda: codec.decode_body(body))
    if kind == "ok":
        assert isinstance(result, dict)
    else:
        assert (result.status, kind) == (400, "InvalidInput")


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


@given(JSON)
def test_any_json_value_reads_as_a_vector_or_raises_invalid_input(value: Any) -> None:
    request = codec.decode_body(orjson.dumps({"input": [value]}))
    iface = interface_of(metadata((spec("x", "FP64", [-1, 2]),), (spec("y", "FP64", [-1]),), 4))
    kind, result = outcome(lambda: codec.read_inputs(request, iface))
    if kind == "ok":
        (vector,) = result
        assert vector.shape == (2,)
        assert vector.tolist() == [float(v) for v in value]
    else:
        assert kind == "InvalidInput"


FLOATS = st.floats(allow_nan=False, allow_infinity=False)


@given(st.lists(st.lists(FLOATS, min_size=1, max_size=8), min_size=1, max_size=4))
def test_outputs_encode_as_json_that_reads_back_bit_for_bit(vectors: list[list[float]]) -> None:
    arrays = [np.array(vector, dtype=np.float64) for vector in vectors]
    decoded = orjson.loads(codec.encode_outputs(arrays))
    assert list(decoded) == ["output"]
    assert decoded["output"] == vectors
    assert orjson.loads(codec.encode_vector(arrays[0])) == {"output": vectors[0]}


@given(st.lists(st.one_of(st.integers(-(2**63), 2**64 - 1), FLOATS), max_size=10))
def test_numbers_read_as_float64(values: list[float]) -> None:
    vector = codec.read_vector(orjson.loads(orjson.dumps(values)), "v", len(values))
    assert vector.tolist() == [float(v) for v in values]


def test_info_and_model_info_carry_exactly_the_spec_keys() -> None:
    assert codec.encode_info(["a"]) == b'{"protocolVersion":1.0,"models":["a"]}'
    assert orjson.loads(codec.encode_model_info(BATCHED)) == {
        "support": {
            "Evaluate": True,
            "Gradient": True,
            "ApplyJacobian": False,
            "ApplyHessian": False,
        }
    }
    assert codec.encode_sizes("inputSizes", (4, 1)) == b'{"inputSizes":[4,1]}'


def test_nan_outputs_become_null() -> None:
    assert codec.encode_vector(np.array([np.nan, 1.0])) == b'{"output":[null,1.0]}'


@pytest.mark.parametrize(
    ("name", "config", "error"),
    [
        ("x", {}, None),
        (None, None, None),
        (3, None, "ModelNotFound"),
        ("x", [1], "InvalidInput"),
        ("x", "a=1", "InvalidInput"),
    ],
)
def test_name_and_config_types(name: Any, config: Any, error: str | None) -> None:
    request = {"name": name, "config": config}
    kind, _ = outcome(lambda: (codec.read_name(request), codec.read_config(request)))
    assert kind == (error or "ok")
    if error is None:
        assert codec.read_name(request) == name
        assert codec.read_config(request) is None  # empty or absent: no parameters
    assert codec.read_config({"config": {"k": 1}}) == {"k": 1}


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (BadRequest("b"), 400, "InvalidInput"),
        (TooLarge("t"), 413, "InvalidInput"),
        (ModelNotFound("n"), 400, "ModelNotFound"),
        (Unsupported("u"), 400, "UnsupportedFeature"),
        (ModelFailed("f"), 500, "InvalidOutput"),
        (ModelNotReady("r"), 503, "ModelNotReady"),
        (Overloaded("o"), 429, "Overloaded"),
        (DeadlineExceeded("d"), 504, "DeadlineExceeded"),
        (WorkerLost("w"), 500, "WorkerLost"),
        (InternalError("i"), 500, "InternalError"),
    ],
)
def test_appliance_errors_map_onto_the_umbridge_form(error: Any, status: int, kind: str) -> None:
    mapped = from_appliance(error)
    assert (mapped.status, mapped.type, mapped.message) == (status, kind, error.message)
    assert orjson.loads(encode_error(mapped)) == {"error": {"type": kind, "message": error.message}}
