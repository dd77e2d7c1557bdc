"""Every demo model through the internal client API, in a running appliance."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.client.api import ModelClient
from appliance.core.dtypes import DType, to_numpy
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest, ModelNotFound, Unsupported
from tests.system.harness import Appliance

HOLDOUT = "tests/data/digits_holdout.npz"


def test_simple_adds_and_subtracts(client: ModelClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    with client.infer("simple", {"INPUT0": a, "INPUT1": b}) as result:
        np.testing.assert_array_equal(result.array("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.array("OUTPUT1"), a - b)


def test_simple_returns_only_requested_outputs(client: ModelClient) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    with client.infer("simple", {"INPUT0": a, "INPUT1": a}, outputs=["OUTPUT1"]) as result:
        assert list(result.outputs) == ["OUTPUT1"]
        np.testing.assert_array_equal(result.array("OUTPUT1"), np.zeros((2, 16)))


def test_simple_string_works_on_decimal_strings(client: ModelClient) -> None:
    a = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    b = np.array([[b"1"] * 16], dtype=object)
    with client.infer("simple_string", {"INPUT0": a, "INPUT1": b}) as result:
        assert [int(x) for x in result.array("OUTPUT0")[0]] == [i + 1 for i in range(16)]
        assert [int(x) for x in result.array("OUTPUT1")[0]] == [i - 1 for i in range(16)]


def test_simple_identity_keeps_nul_bytes(client: ModelClient) -> None:
    data = np.array([[b"he\x00llo", b"\x00\x01\x02\x03", b""]], dtype=object)
    with client.infer("simple_identity", {"INPUT0": data}) as result:
        assert result["OUTPUT0"].dtype is DType.BYTES
        assert result.array("OUTPUT0").tolist() == data.tolist()


@pytest.mark.parametrize("shape", [(1, 4), (3, 1000), (512, 1024)])
def test_identity_returns_the_input(client: ModelClient, shape: tuple[int, int]) -> None:
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    with client.infer("identity", {"INPUT0": x}) as result:
        np.testing.assert_array_equal(result.array("OUTPUT0"), x)


def test_forward_doubles_and_has_a_gradient(client: ModelClient) -> None:
    with client.infer("forward", {"x": np.array([[3.0]])}) as result:
        assert result.array("y").tolist() == [[6.0]]
    gradient = client.derivative(
        "forward", "gradient", {"x": np.array([[3.0]])}, out_wrt="y", in_wrt="x", sens=[0.5]
    )
    assert gradient.tolist() == [1.0]
    with pytest.raises(Unsupported, match="apply_jacobian"):
        client.derivative(
            "forward", "apply_jacobian", {"x": np.array([[3.0]])}, out_wrt="y", in_wrt="x", vec=[1]
        )


def _rosenbrock(x: np.ndarray) -> float:
    return float((1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2)


def test_rosenbrock_derivatives_match_finite_differences(client: ModelClient) -> None:
    point = np.array([0.7, -0.3])
    inputs = {"x": point.reshape(1, 2)}
    with client.infer("rosenbrock", inputs) as result:
        assert result.array("f")[0, 0] == pytest.approx(_rosenbrock(point))
    h = 1e-5
    numeric = np.array(
        [(_rosenbrock(point + h * e) - _rosenbrock(point - h * e)) / (2 * h) for e in np.eye(2)]
    )
    gradient = client.derivative(
        "rosenbrock", "gradient", inputs, out_wrt="f", in_wrt="x", sens=[2.0]
    )
    np.testing.assert_allclose(gradient, 2.0 * numeric, rtol=1e-6)
    vec = np.array([0.3, -1.2])
    jv = client.derivative("rosenbrock", "apply_jacobian", inputs, out_wrt="f", in_wrt="x", vec=vec)
    np.testing.assert_allclose(jv, [numeric @ vec], rtol=1e-6)

    def grad(p: np.ndarray) -> np.ndarray:
        return client.derivative(
            "rosenbrock", "gradient", {"x": p.reshape(1, 2)}, out_wrt="f", in_wrt="x", sens=[1.0]
        )

    hv_numeric = (grad(point + h * vec) - grad(point - h * vec)) / (2 * h)
    hv = client.derivative(
        "rosenbrock",
        "apply_hessian",
        inputs,
        out_wrt="f",
        in_wrt="x",
        in_wrt2="x",
        sens=[1.0],
        vec=vec,
    )
    np.testing.assert_allclose(hv, hv_numeric, rtol=1e-5)


def test_digits_classifies_the_holdout(client: ModelClient) -> None:
    data = np.load(HOLDOUT)
    pixels = data["X"].astype(np.float32)
    predictions = []
    for start in range(0, len(pixels), 64):
        with client.infer("digits", {"pixels": pixels[start : start + 64]}) as result:
            predictions.append(result.array("probabilities").argmax(axis=1))
    accuracy = float((np.concatenate(predictions) == data["y"]).mean())
    assert accuracy >= 0.95


def test_echo_returns_every_payload_kind(client: ModelClient) -> None:
    payload = {
        "str_data": np.array([b"hello"], dtype=object),
        "bin_data": np.array([bytes(range(256))], dtype=object),
        "tensor": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    with client.infer("echo", payload) as result:
        for name, value in payload.items():
            assert result.array(name).tolist() == value.tolist()


def test_echo_streams_the_payload_in_parts(client: ModelClient) -> None:
    text = b"the quick brown fox"
    parts = [
        part.array("str_data")[0]
        for part in client.stream("echo", {"str_data": np.array([text], dtype=object)})
    ]
    assert len(parts) == 3
    assert b"".join(parts) == text


def test_closing_a_stream_early_cancels_it(client: ModelClient) -> None:
    stream = client.stream(
        "echo",
        {"x": np.arange(10, dtype=np.float32)},
        parameters={"chunks": 10, "chunk_delay_s": 0.05},
    )
    first = next(stream)
    assert first.array("x").tolist() == [0.0]
    stream.close()
    # The instance is free again at once: the next request is not stuck behind it.
    with client.infer("echo", {"y": np.zeros(1)}, timeout_s=5.0) as result:
        assert result.array("y").tolist() == [0.0]


@pytest.mark.parametrize("dtype", list(DType))
def test_every_dtype_round_trips(client: ModelClient, dtype: DType) -> None:
    rng = np.random.default_rng(1)
    if dtype is DType.BYTES:
        array = np.array([[b"a", b"", b"\x00z"], [b"long" * 50, b"x", b"y"]], dtype=object)
    elif dtype is DType.BOOL:
        array = rng.random((2, 3)) > 0.5
    else:
        array = (rng.random((2, 3)) * 100).astype(to_numpy(dtype))
    with client.infer("echo", {"t": Tensor.from_array(array)}) as result:
        assert result["t"].dtype is dtype
        assert result.array("t").tolist() == array.tolist()


def test_errors_name_what_was_wrong(client: ModelClient) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(ModelNotFound, match="Request for unknown model: 'nope'"):
        client.infer("nope", {"INPUT0": a})
    with pytest.raises(BadRequest, match="missing input 'INPUT1'"):
        client.infer("simple", {"INPUT0": a})
    with pytest.raises(BadRequest, match="expected datatype INT32, got FP32"):
        client.infer("simple", {"INPUT0": a.astype(np.float32), "INPUT1": a})
    with pytest.raises(BadRequest, match=r"shape \[1, 15\] does not match"):
        client.infer("simple", {"INPUT0": a[:, :15], "INPUT1": a[:, :15]})
    # More rows than max_batch_size (8) is no error: they are served in pieces.
    big = np.arange(9 * 16, dtype=np.int32).reshape(9, 16)
    with client.infer("simple", {"INPUT0": big, "INPUT1": big}) as result:
        assert result.array("OUTPUT0").tolist() == (2 * big).tolist()
    with pytest.raises(BadRequest, match="no output named 'OUTPUT9'"):
        client.infer("simple", {"INPUT0": a, "INPUT1": a}, outputs=["OUTPUT9"])
    # The model keeps serving after every error.
    with client.infer("simple", {"INPUT0": a, "INPUT1": a}) as result:
        assert result.array("OUTPUT0").shape == (1, 16)


def test_metadata_describes_each_model(client: ModelClient) -> None:
    assert client.models() == [
        "simple",
        "simple_int8",
        "simple_string",
        "simple_identity",
        "identity",
        "custom_identity_int32",
        "forward",
        "rosenbrock",
        "digits",
        "echo",
        "repeat_int32",
        "simple_sequence",
        "simple_dyna_sequence",
        "simple_string_dyna_sequence",
    ]  # the test's config order (tests/system/harness.py DEMO_MODELS)
    meta = client.metadata("simple")
    assert meta.max_batch_size == 8
    assert [(s.name, s.dtype.value, list(s.shape)) for s in meta.inputs or ()] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert client.metadata("echo").inputs is None
    assert client.metadata("forward").supports["gradient"] is True
    assert client.metadata("forward").supports["apply_hessian"] is False
    with pytest.raises(ModelNotFound):
        client.metadata("nope")


def test_two_clients_in_one_process_each_get_their_replies(demo: Appliance) -> None:
    first, second = demo.client(), demo.client()
    for value in range(5):
        for client in (first, second, first):
            x = np.full((1, 4), value, dtype=np.float32)
            with client.infer("identity", {"INPUT0": x}, timeout_s=10) as result:
                np.testing.assert_array_equal(result.array("OUTPUT0"), x)
