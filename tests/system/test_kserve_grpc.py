"""KServe v2 over gRPC, driven by the stock tritonclient over a real socket.

Raw requests (typed contents, malformed messages) are built with
tritonclient's own ``service_pb2``: this process must never import the
appliance's generated ``kserve_pb2``, which defines the same protobuf names.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from appliance.client.api import ModelClient
from tests.gpu import cuda_driver_missing
from tests.system.harness import Appliance, demo_models, eventually, rendezvous, running

MODELS = [
    *demo_models(
        "simple",
        "simple_int8",
        "simple_string",
        "simple_identity",
        "identity",
        "echo",
        "repeat_int32",
    ),
    {"name": "slow", "class": "tests.models:Slow"},
    {"name": "params", "class": "tests.models:ParameterEcho"},
]
SIMPLE_IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_IN1 = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(MODELS) as started:
        yield started


@pytest.fixture(scope="module")
def client(grpc_client: grpcclient.InferenceServerClient) -> grpcclient.InferenceServerClient:
    return grpc_client


@pytest.fixture(scope="module")
def stub(appliance: Appliance) -> Iterator[Any]:
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{appliance.ports['grpc']}", options) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    value = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    value.set_data_from_numpy(array)
    return value


def simple_inputs() -> list[grpcclient.InferInput]:
    return [tensor("INPUT0", SIMPLE_IN0), tensor("INPUT1", SIMPLE_IN1)]


def assert_serving(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("simple", simple_inputs())
    assert np.array_equal(result.as_numpy("OUTPUT0"), SIMPLE_IN0 + SIMPLE_IN1)


def failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


# -- health, metadata, configuration --------------------------------------------


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live(headers={"test": "1"})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "2")
    assert not client.is_model_ready("no_such_model")
    server = client.get_server_metadata()
    assert server.name == "triton"
    assert set(server.extensions) == {
        "binary_tensor_data",
        "parameters",
        "statistics",
        "model_configuration",
        "system_shared_memory",
        "model_repository",
        "trace",
    }
    model = client.get_model_metadata("simple", as_json=True)
    assert model["name"] == "simple"
    assert model["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("INPUT0", "INT32", ["-1", "16"]),
        ("INPUT1", "INT32", ["-1", "16"]),
    ]
    assert client.get_model_metadata("simple", "1").name == "simple"


def test_unknown_model_and_version_are_not_found(client: grpcclient.InferenceServerClient) -> None:
    error = failure(lambda: client.get_model_metadata("wrong_model_name"))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert error.message() == "Request for unknown model: 'wrong_model_name' is not found"
    error = failure(lambda: client.infer("wrong_model_name", simple_inputs()))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert error.message().startswith("Request for unknown model")
    error = failure(lambda: client.infer("simple", simple_inputs(), model_version="2"))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "'simple' version 2 is not found" in error.message()
    result = client.infer("simple", simple_inputs(), model_version="1")
    assert result.get_response().model_version == "1"
    assert_serving(client)


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple").config
    assert config.name == "simple"
    assert config.max_batch_size == 8
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", 8, [16]),  # TYPE_INT32
        ("INPUT1", 8, [16]),
    ]
    assert config.instance_group[0].count == 1
    strings = client.get_model_config("simple_string", as_json=True)["config"]
    assert strings["input"][0]["data_type"] == "TYPE_STRING"
    assert client.get_model_config("identity").config.max_batch_size == 0
    assert client.get_model_config("echo").config.model_transaction_policy.decoupled


# -- inference -------------------------------------------------------------------


def test_simple_as_the_example_client_does(client: grpcclient.InferenceServerClient) -> None:
    outputs = [
        grpcclient.InferRequestedOutput("OUTPUT0"),
        grpcclient.InferRequestedOutput("OUTPUT1"),
    ]
    result = client.infer(
        "simple", simple_inputs(), outputs=outputs, request_id="req-7", headers={"test": "1"}
    )
    assert np.array_equal(result.as_numpy("OUTPUT0"), SIMPLE_IN0 + SIMPLE_IN1)
    assert np.array_equal(result.as_numpy("OUTPUT1"), SIMPLE_IN0 - SIMPLE_IN1)
    response = result.get_response()
    assert response.id == "req-7"
    assert response.model_name == "simple"
    assert len(client.get_inference_statistics(model_name="simple").model_stats) == 1
    result = client.infer("simple", simple_inputs())
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT0", "OUTPUT1"]
    assert np.array_equal(result.as_numpy("OUTPUT1"), SIMPLE_IN0 - SIMPLE_IN1)


def test_only_the_requested_outputs_come_back_in_order(
    client: grpcclient.InferenceServerClient,
) -> None:
    only = [grpcclient.InferRequestedOutput("OUTPUT1")]
    response = client.infer("simple", simple_inputs(), outputs=only).get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT1"]
    assert len(response.raw_output_contents) == 1
    both = [grpcclient.InferRequestedOutput("OUTPUT1"), grpcclient.InferRequestedOutput("OUTPUT0")]
    result = client.infer("simple", simple_inputs(), outputs=both)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1", "OUTPUT0"]
    assert np.array_equal(result.as_numpy("OUTPUT0"), SIMPLE_IN0 + SIMPLE_IN1)


EVERY_DTYPE = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([0, 7, 255], dtype=np.uint8),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "UINT32": np.array([[0, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], dtype=np.int16),
    "INT32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
    "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "FP16": np.array([0.5, -1.25, 65504.0], dtype=np.float16),
    "FP32": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    "FP64": np.array([np.pi, -np.e, 1e300]),
    "BYTES": np.array([[b"a", b"he\x00llo"], [b"\xff\xfe", b""]], dtype=object),
}


def test_every_dtype_round_trips_through_echo(client: grpcclient.InferenceServerClient) -> None:
    inputs = [tensor(name, array) for name, array in EVERY_DTYPE.items()]
    result = client.infer("echo", inputs)
    for name, array in EVERY_DTYPE.items():
        got = result.as_numpy(name)
        assert (got.dtype, got.shape) == (array.dtype, array.shape), name
        assert np.array_equal(got, array), name


def test_identity_round_trips_16_mib(client: grpcclient.InferenceServerClient) -> None:
    array = np.random.default_rng(3).random((4, 1 << 20), dtype=np.float32)
    result = client.infer("identity", [tensor("INPUT0", array)])
    assert np.array_equal(result.as_numpy("OUTPUT0"), array)
    small = np.array([[1.5, -2.5]], dtype=np.float32)
    assert np.array_equal(
        client.infer("identity", [tensor("INPUT0", small)]).as_numpy("OUTPUT0"), small
    )


def test_strings_models(client: grpcclient.InferenceServerClient) -> None:
    numbers = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    ones = np.array([[b"1"] * 16], dtype=object)
    result = client.infer("simple_string", [tensor("INPUT0", numbers), tensor("INPUT1", ones)])
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == list(range(1, 17))
    nul = np.array([[b"he\x00llo", b"\x00\x01\x02\x03"]], dtype=object)
    echoed = client.infer("simple_identity", [tensor("INPUT0", nul)]).as_numpy("OUTPUT0")
    assert np.array_equal(echoed, nul)


def test_typed_contents_are_accepted(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple", id="typed")
    first = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    first.contents.int_contents.extend(range(16))
    second = request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    second.contents.int_contents.extend([1] * 16)
    response = stub.ModelInfer(request, timeout=30)
    assert response.id == "typed"
    assert np.frombuffer(response.raw_output_contents[0], "<i4").tolist() == list(range(1, 17))
    request = service_pb2.ModelInferRequest(model_name="echo")
    words = request.inputs.add(name="words", datatype="BYTES", shape=[2])
    words.contents.bytes_contents.extend([b"x\x00y", b"z"])
    floats = request.inputs.add(name="floats", datatype="FP64", shape=[2])
    floats.contents.fp64_contents.extend([0.25, -8.0])
    response = stub.ModelInfer(request, timeout=30)
    assert response.raw_output_contents[0] == b"\x03\x00\x00\x00x\x00y\x01\x00\x00\x00z"
    assert np.frombuffer(response.raw_output_contents[1], "<f8").tolist() == [0.25, -8.0]


def test_int8_sum_and_difference_as_the_example_client_does(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple_int8")
    first = request.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 16])
    first.contents.int_contents.extend(range(16))
    second = request.inputs.add(name="INPUT1", datatype="INT8", shape=[1, 16])
    second.contents.int_contents.extend([1] * 16)
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    response = stub.ModelInfer(request, timeout=30)
    assert [o.datatype for o in response.outputs] == ["INT8", "INT8"]
    assert np.frombuffer(response.raw_output_contents[0], np.int8).tolist() == list(range(1, 17))
    assert np.frombuffer(response.raw_output_contents[1], np.int8).tolist() == list(range(-1, 15))
    request.model_version = "wrong_specification"
    error = raw_error(stub, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "version string 'wrong_specification'" in (error.details() or "")


def raw_error(stub: Any, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=30)
    return caught.value


def test_malformed_messages_are_invalid_arguments(
    stub: Any, client: grpcclient.InferenceServerClient
) -> None:
    mixed = service_pb2.ModelInferRequest(model_name="simple")
    mixed.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    typed = mixed.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    typed.contents.int_contents.extend([1] * 16)
    mixed.raw_input_contents.append(SIMPLE_IN0.tobytes())
    half = service_pb2.ModelInferRequest(model_name="identity")
    half.inputs.add(name="INPUT0", datatype="FP16", shape=[1]).contents.fp32_contents.append(1)
    short = service_pb2.ModelInferRequest(model_name="simple")
    short.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
    short.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    short.raw_input_contents.extend([SIMPLE_IN0.tobytes(), b"\x00" * 60])
    odd = service_pb2.ModelInferRequest(model_name="simple")
    odd.inputs.add(name="INPUT0", datatype="COMPLEX", shape=[1])
    expected = [
        (mixed, "typed contents"),
        (half, "FP16 data must be sent in raw_input_contents"),
        (short, "input INPUT1: 60 bytes of data do not match shape [1, 16] of INT32"),
        (odd, "unsupported datatype 'COMPLEX'"),
    ]
    for request, words in expected:
        error = raw_error(stub, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in error.details()
        assert_serving(client)


def test_wrong_dtype_and_shape_are_invalid_arguments(
    client: grpcclient.InferenceServerClient,
) -> None:
    floats = [tensor("INPUT0", SIMPLE_IN0.astype(np.float32)), tensor("INPUT1", SIMPLE_IN1)]
    error = failure(lambda: client.infer("simple", floats))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "expected datatype INT32, got FP32" in error.message()
    assert_serving(client)
    wide = [
        tensor("INPUT0", np.zeros((1, 17), np.int32)),
        tensor("INPUT1", np.zeros((1, 17), np.int32)),
    ]
    error = failure(lambda: client.infer("simple", wide))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "shape [1, 17] does not match" in error.message()
    assert_serving(client)


def test_parameters_of_all_five_kinds_reach_the_model(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="params")
    request.inputs.add(name="x", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.zeros(1, np.float32).tobytes())
    request.parameters["flag"].bool_param = True
    request.parameters["count"].int64_param = -5
    request.parameters["text"].string_param = "hé"
    request.parameters["ratio"].double_param = 0.25
    request.parameters["big"].uint64_param = 2**64 - 1
    response = stub.ModelInfer(request, timeout=30)
    packed = response.raw_output_contents[0]
    seen = orjson.loads(packed[4:])
    assert seen == {"flag": True, "count": -5, "text": "hé", "ratio": 0.25, "big": 2**64 - 1}


def test_deadlines_and_timeouts(client: grpcclient.InferenceServerClient) -> None:
    x = tensor("x", np.ones(3, np.float32))
    started = time.monotonic()
    error = failure(
        lambda: client.infer("slow", [x], parameters={"sleep_s": 2.0}, client_timeout=0.3)
    )
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    error = failure(lambda: client.infer("slow", [x], parameters={"sleep_s": 2.0}, timeout=300_000))
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 1.9
    assert_serving(client)


def test_model_failure_is_internal(client: grpcclient.InferenceServerClient) -> None:
    x = tensor("x", np.ones(3, np.float32))
    error = failure(lambda: client.infer("slow", [x], parameters={"fail": True}))
    assert error.status() == "StatusCode.INTERNAL"
    assert "asked to fail" in error.message()
    assert_serving(client)


def test_statistics_count_real_inferences(client: grpcclient.InferenceServerClient) -> None:
    def successes() -> int:
        stats = client.get_inference_statistics("identity").model_stats
        assert len(stats) == 1
        assert stats[0].name == "identity"
        assert stats[0].version == "1"
        return int(stats[0].inference_stats.success.count)

    before = successes()
    for _ in range(3):
        client.infer("identity", [tensor("INPUT0", np.ones((1, 2), np.float32))])
    assert eventually(lambda: successes() >= before + 3, 5.0)
    every = client.get_inference_statistics().model_stats
    assert [s.name for s in every] == [m["name"] for m in MODELS]
    error = failure(lambda: client.get_inference_statistics("nope"))
    assert error.status() == "StatusCode.NOT_FOUND"


def test_stream_answers_each_request_and_survives_errors(
    client: grpcclient.InferenceServerClient,
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("simple", simple_inputs(), request_id="a")
        client.async_stream_infer("no_such_model", simple_inputs(), request_id="b")
        echo = [tensor("x", np.arange(6, dtype=np.float32))]
        client.async_stream_infer("echo", echo, request_id="c", enable_empty_final_response=True)
        got = [answers.get(timeout=30) for _ in range(6)]
    finally:
        client.stop_stream()
    # The requests are answered side by side, as Triton answers a stream's requests:
    # each one's answers in their order, the requests' in the order they are ready.
    errors = [error for _, error in got if error is not None]
    by_id: dict[str, list[Any]] = {}
    for result, error in got:
        if error is None:
            by_id.setdefault(result.get_response().id, []).append(result)
    assert [error.message() for error in errors] == [
        "Request for unknown model: 'no_such_model' is not found"
    ]
    (first,) = by_id["a"]
    assert np.array_equal(first.as_numpy("OUTPUT0"), SIMPLE_IN0 + SIMPLE_IN1)
    *parts, final = by_id["c"]
    pieces = [result.as_numpy("x") for result in parts]
    assert np.array_equal(np.concatenate(pieces), np.arange(6, dtype=np.float32))
    flags = [
        result.get_response().parameters["triton_final_response"].bool_param for result in parts
    ]
    assert flags == [False, False, False]
    assert final.get_response().parameters["triton_final_response"].bool_param
    assert final.as_numpy("x") is None


def test_a_flood_on_one_stream_is_answered_request_by_request(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Far more requests than a stream answers at once (64): each gets its answer."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index in range(300):
            client.async_stream_infer("simple", simple_inputs(), request_id=str(index))
        got = [answers.get(timeout=60) for _ in range(300)]
    finally:
        client.stop_stream()
    assert [error for _, error in got if error is not None] == []
    assert sorted(int(result.get_response().id) for result, _ in got) == list(range(300))
    assert all(np.array_equal(r.as_numpy("OUTPUT0"), SIMPLE_IN0 + SIMPLE_IN1) for r, _ in got)


def test_a_stream_s_requests_are_answered_side_by_side(tmp_path: Path) -> None:
    """Two requests on one stream run at once: the rendezvous model answers each only
    when both its instances run a call at the same time (one after the other, each fails
    after its wait)."""
    with running([rendezvous(tmp_path)]) as appliance:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for name in ("p", "q"):
                x = [tensor("x", np.ones(1, dtype=np.float64))]
                client.async_stream_infer("rendezvous", x, request_id=name)
            got = [answers.get(timeout=60) for _ in range(2)]
        finally:
            client.stop_stream()
            client.close()
    assert [error for _, error in got] == [None, None]
    assert sorted(result.get_response().id for result, _ in got) == ["p", "q"]


def test_a_cancelled_stream_stops_the_decoupled_model(appliance: Appliance) -> None:
    model_client = appliance.client()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        echo = [tensor("x", np.arange(40, dtype=np.float32))]
        # 40 parts a quarter of a second apart: 10 s unless the cancel stops it.
        parameters = {"chunks": 40, "chunk_delay_s": 0.25}
        client.async_stream_infer("echo", echo, request_id="long", parameters=parameters)
        _, error = answers.get(timeout=30)
        assert error is None
        assert queued(model_client, "echo") == 1
        client.stop_stream(cancel_requests=True)
        deadline = time.monotonic() + 5.0
        while queued(model_client, "echo") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queued(model_client, "echo") == 0, "the model still streams for a gone client"
    finally:
        client.close()
        model_client.close()


def queued(client: ModelClient, model: str) -> int:
    """Requests queued or running in the model's instances."""
    return sum(client.status.read(slot).depth for slot in client.router.slots[model])


def test_repository_index_and_model_control(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    # By name, as Triton lists them.
    assert [(m["name"], m["state"]) for m in index] == sorted((m["name"], "READY") for m in MODELS)
    client.load_model("simple")
    assert client.is_model_ready("simple")
    error = failure(lambda: client.load_model("wrong_model_name"))
    assert "failed to load" in error.message()
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    index = client.get_model_repository_index(as_json=True)["models"]
    unloaded = {m["name"]: m for m in index}["simple"]
    assert (unloaded["state"], unloaded["reason"]) == ("UNAVAILABLE", "unloaded")
    client.load_model("simple")
    assert client.is_model_ready("simple")


def test_load_with_an_override_config(client: grpcclient.InferenceServerClient) -> None:
    # As Triton's simple_grpc_model_control.py: int64 fields come as strings.
    malformed = '"parameters": {"config": {{"max_batch_size": "16"}}}'
    error = failure(lambda: client.load_model("simple", config=malformed))
    assert "failed to load" in error.message()
    assert "not valid JSON" in error.message()
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    error = failure(lambda: client.load_model("simple", config='{"backend": "onnx"}'))
    assert "backend" in error.message()
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.get_model_config("simple").config.max_batch_size == 8
    override = '{"max_batch_size":"16","instance_group":[{"count":"2","kind":"KIND_CPU"}]}'
    client.load_model("simple", config=override)
    config = client.get_model_config("simple").config
    assert (config.max_batch_size, config.instance_group[0].count) == (16, 2)
    rows = np.tile(SIMPLE_IN0, (16, 1))
    result = client.infer("simple", [tensor("INPUT0", rows), tensor("INPUT1", rows)])
    assert np.array_equal(result.as_numpy("OUTPUT0"), rows * 2)
    client.unload_model("simple")
    client.load_model("simple")
    config = client.get_model_config("simple").config
    assert (config.max_batch_size, config.instance_group[0].count) == (8, 1)
    error = failure(
        lambda: client.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
    )
    # Triton's model-control example expects INTERNAL here: its repository poll fails.
    assert error.status() == "StatusCode.INTERNAL"
    assert "failed to poll from model repository" in error.message()
    assert "Invalid file path" in error.message()
    assert client.is_server_live()
    assert client.is_model_ready("simple")


def test_repeat_int32_answers_each_element_then_flags_the_final_response(
    appliance: Appliance,
) -> None:
    # As Triton's simple_grpc_custom_repeat.py, with the empty final response asked for.
    responses: queue.Queue[Any] = queue.Queue()
    values = np.arange(100, 104, dtype=np.int32)
    inputs = [
        tensor("IN", values),
        tensor("DELAY", np.full(4, 10, np.uint32)),
        tensor("WAIT", np.array([10], np.uint32)),
    ]
    with grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}") as triton:
        triton.start_stream(callback=lambda result, error: responses.put(error or result))
        triton.async_stream_infer("repeat_int32", inputs, enable_empty_final_response=True)
        got = [responses.get(timeout=30) for _ in range(5)]
    for index, result in enumerate(got[:4]):
        response = result.get_response()
        assert response.parameters["triton_final_response"].bool_param is False
        assert result.as_numpy("OUT").tolist() == [100 + index]
        assert result.as_numpy("IDX").tolist() == [index]
    final = got[4].get_response()
    assert final.parameters["triton_final_response"].bool_param is True
    assert list(final.outputs) == []


def test_cuda_shared_memory_on_a_cpu_only_server(client: grpcclient.InferenceServerClient) -> None:
    if not cuda_driver_missing():
        pytest.skip("a GPU is usable here: tests/system/test_cuda_shm.py covers CUDA shm")
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("anything")
    assert len(client.get_cuda_shared_memory_status().regions) == 0
    error = failure(lambda: client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64))
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    assert "CPU-only" in error.message()


def test_readiness_follows_the_master(
    appliance: Appliance, client: grpcclient.InferenceServerClient
) -> None:
    appliance.ctl("offline")
    try:
        assert eventually(lambda: not client.is_server_ready(), 5.0)
        assert not client.is_model_ready("simple")
        assert client.is_server_live()
        assert_serving(client)
    finally:
        appliance.ctl("online")
    assert eventually(client.is_server_ready, 5.0)
    assert client.is_model_ready("simple")


@pytest.mark.parametrize(
    "method",
    [
        "/inference.GRPCInferenceService/NoSuchMethod",
        "/inference.GRPCInferenceService/modelinfer",  # names are case-sensitive
        "/no.such.Service/ModelInfer",
        "/inference.GRPCInferenceService/ModelInfer/extra",
        "/" + "x" * 4000,
    ],
)
def test_an_unknown_method_is_unimplemented_and_the_server_serves_on(
    appliance: Appliance, client: grpcclient.InferenceServerClient, method: str
) -> None:
    address = f"127.0.0.1:{appliance.ports['grpc']}"
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary(method)(b"\x00garbage", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert_serving(client)
