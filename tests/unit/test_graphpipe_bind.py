"""GraphPipe bindings: input/output naming, type conversions, config."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, spec
from appliance.protocols.graphpipe import codec
from appliance.protocols.graphpipe.bind import bind, conform, decode_config, select_outputs
from appliance.protocols.graphpipe.errors import GraphPipeCode, GraphPipeError
from appliance.protocols.graphpipe.request import InferRequest
from tests.unit.test_graphpipe_encoder import encode_infer_request

SIMPLE = ModelMetadata(
    "simple",
    ("1",),
    "python",
    (spec("INPUT0", "INT32", [-1, 2]), spec("INPUT1", "INT32", [-1, 2])),
    (spec("OUTPUT0", "INT32", [-1, 2]), spec("OUTPUT1", "INT32", [-1, 2])),
    8,
)
ECHO = ModelMetadata("echo", ("1",), "python", None, None, 0)
PAIR = np.ones((1, 2), np.int32)


def request(*arrays: Any, names: Any = (), outputs: Any = (), config: Any = "") -> InferRequest:
    decoded = codec.decode_request(encode_infer_request(arrays, names, outputs, config))
    assert isinstance(decoded, InferRequest)
    return decoded


def error_code(metadata: ModelMetadata, decoded: InferRequest) -> GraphPipeCode:
    with pytest.raises(GraphPipeError) as raised:
        bind(metadata, decoded)
    return raised.value.code


def test_unnamed_inputs_map_by_position() -> None:
    binding = bind(SIMPLE, request(PAIR, 2 * PAIR))
    assert list(binding.inputs) == ["INPUT0", "INPUT1"]
    assert binding.inputs["INPUT1"].array().tolist() == [[2, 2]]
    assert binding.outputs is None
    assert binding.parameters is None


def test_an_empty_name_means_the_declared_input_at_its_position() -> None:
    binding = bind(SIMPLE, request(PAIR, 2 * PAIR, names=["", "INPUT1"]))
    assert binding.inputs["INPUT0"].array().tolist() == [[1, 1]]
    assert binding.inputs["INPUT1"].array().tolist() == [[2, 2]]
    # Position 1 is INPUT1 whatever came before, as in the Go reference.
    assert error_code(SIMPLE, request(PAIR, PAIR, names=["INPUT1", ""])) is (
        GraphPipeCode.INPUT_NAMES
    )


def test_generic_models_name_inputs_input0_input1() -> None:
    binding = bind(ECHO, request(PAIR, np.zeros(3), names=["", "b"]))
    assert list(binding.inputs) == ["input0", "b"]


@pytest.mark.parametrize(
    ("decoded", "code"),
    [
        (request(PAIR, PAIR, names=["INPUT0", "BOGUS"]), GraphPipeCode.UNKNOWN_INPUT),
        (request(PAIR), GraphPipeCode.MISSING_INPUT),
        (request(PAIR, PAIR, names=["INPUT0"]), GraphPipeCode.INPUT_NAMES),
        (request(PAIR, PAIR, names=["INPUT0", "INPUT0"]), GraphPipeCode.INPUT_NAMES),
        (request(PAIR, PAIR, PAIR), GraphPipeCode.INPUT_NAMES),
        (request(PAIR, PAIR, outputs=["NOPE"]), GraphPipeCode.UNKNOWN_OUTPUT),
        (request(PAIR, PAIR, outputs=["", "", ""]), GraphPipeCode.UNKNOWN_OUTPUT),
        (request(PAIR, PAIR.astype(np.float32)), GraphPipeCode.TYPE_MISMATCH),
        (request(PAIR, np.array([["1", "2"]])), GraphPipeCode.TYPE_MISMATCH),
        (request(PAIR, np.ones((1, 3), np.int32)), GraphPipeCode.SHAPE_MISMATCH),
        (request(PAIR, np.ones(2, np.int32)), GraphPipeCode.SHAPE_MISMATCH),
        (request(PAIR, np.full((1, 2), 1 << 40)), GraphPipeCode.VALUE_OUT_OF_RANGE),
        (request(PAIR, PAIR, config=b"\xff\xfe"), GraphPipeCode.BAD_CONFIG),
    ],
)
def test_binding_errors_have_distinct_codes(decoded: InferRequest, code: GraphPipeCode) -> None:
    assert error_code(SIMPLE, decoded) is code


def test_output_names_by_name_and_position() -> None:
    assert bind(SIMPLE, request(PAIR, PAIR, outputs=["OUTPUT1"])).outputs == ["OUTPUT1"]
    assert bind(SIMPLE, request(PAIR, PAIR, outputs=["", ""])).outputs == ["OUTPUT0", "OUTPUT1"]
    assert bind(ECHO, request(PAIR, outputs=[""])).outputs is None
    assert bind(ECHO, request(PAIR, outputs=["x"])).outputs == ["x"]
    assert error_code(ECHO, request(PAIR, outputs=["x", ""])) is GraphPipeCode.UNKNOWN_OUTPUT


def test_select_outputs_orders_and_checks_what_came_back() -> None:
    produced = {name: Tensor.from_array(np.array([i])) for i, name in enumerate("ab")}
    assert [t.array()[0] for t in select_outputs(ECHO, None, produced)] == [0, 1]
    assert [t.array()[0] for t in select_outputs(ECHO, ["b", "a"], produced)] == [1, 0]
    with pytest.raises(GraphPipeError) as raised:
        select_outputs(ECHO, ["c"], produced)
    assert raised.value.code is GraphPipeCode.UNKNOWN_OUTPUT


# -- conversions ---------------------------------------------------------------


def convert(array: Any, dtype: str, shape: Any = (-1,)) -> np.ndarray[Any, Any]:
    tensor = conform("m", spec("x", dtype, shape), Tensor.from_array(np.asarray(array)))
    assert tensor.dtype is DType(dtype)
    return tensor.array()


def test_float64_becomes_float32_when_it_fits_rounding_to_nearest() -> None:
    out = convert([0.1, -3.5, np.inf, -np.inf, 3.4e38], "FP32")
    assert out.dtype == np.float32
    assert out.tolist()[1:] == [-3.5, np.inf, -np.inf, float(np.float32(3.4e38))]
    assert out[0] == np.float32(0.1)
    assert np.isnan(convert([np.nan], "FP32")[0])


def test_float64_too_big_for_float32_is_refused_with_the_value() -> None:
    with pytest.raises(GraphPipeError, match=r"1e\+300 at index \[1\]") as raised:
        convert([1.0, 1e300], "FP32")
    assert raised.value.code is GraphPipeCode.VALUE_OUT_OF_RANGE
    with pytest.raises(GraphPipeError):
        convert([np.float32(70000)], "FP16")


def test_float16_widens_exactly() -> None:
    assert convert(np.array([0.5, 65504], np.float16), "FP64").tolist() == [0.5, 65504.0]


def test_integers_convert_when_every_value_fits() -> None:
    assert convert(np.array([0, 255]), "UINT8").tolist() == [0, 255]
    assert convert(np.array([2**64 - 1], np.uint64), "UINT64").tolist() == [2**64 - 1]
    assert convert(np.zeros(0, np.int64), "INT8").shape == (0,)
    cases: list[tuple[Any, str]] = [
        ([-1], "UINT32"),
        ([256], "UINT8"),
        (np.array([2**63], np.uint64), "INT64"),
    ]
    for array, dtype in cases:
        with pytest.raises(GraphPipeError) as raised:
            convert(array, dtype)
        assert raised.value.code is GraphPipeCode.VALUE_OUT_OF_RANGE


def test_bool_inputs_take_integers_holding_0_and_1() -> None:
    assert convert(np.array([1, 0], np.uint8), "BOOL").tolist() == [True, False]
    with pytest.raises(GraphPipeError) as raised:
        convert(np.array([2], np.uint8), "BOOL")
    assert raised.value.code is GraphPipeCode.VALUE_OUT_OF_RANGE
    with pytest.raises(GraphPipeError) as raised:
        convert(np.array([1.0]), "BOOL")
    assert raised.value.code is GraphPipeCode.TYPE_MISMATCH


def test_integers_and_floats_never_mix() -> None:
    for array, dtype in ((np.array([1]), "FP64"), (np.array([1.0]), "INT64")):
        with pytest.raises(GraphPipeError) as raised:
            convert(array, dtype)
        assert raised.value.code is GraphPipeCode.TYPE_MISMATCH


# -- config --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "parameters"),
    [
        (b"", None),
        (b"  \n", None),
        (b'{"fail": true, "n": [1, 2]}', {"fail": True, "n": [1, 2]}),
        (b"[1, 2]", {"config": "[1, 2]"}),
        (b"debug=1", {"config": "debug=1"}),
        (b"{not json", {"config": "{not json"}),
        ("é".encode(), {"config": "é"}),
    ],
)
def test_config_policy(config: bytes, parameters: Any) -> None:
    assert decode_config(config) == parameters
