"""KServe v2 over REST: the stock tritonclient.http, and raw HTTP for what it cannot send."""

from __future__ import annotations

import gzip
import http.client
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.gpu import cuda_driver_missing
from tests.system.harness import Appliance, demo_models, running

MODELS = [
    *demo_models("simple", "simple_string", "simple_identity", "identity", "echo"),
    {"name": "slow", "class": "tests.models:Slow"},
    {"name": "params", "class": "tests.models:ParameterEcho"},
]
LIMIT = 64 << 20
SIMPLE_IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_IN1 = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(MODELS, http={"max_body_bytes": LIMIT}) as started:
        yield started


@pytest.fixture(scope="module")
def client(appliance: Appliance) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    yield triton
    triton.close()


@pytest.fixture
def conn(appliance: Appliance) -> Iterator[http.client.HTTPConnection]:
    connection = http.client.HTTPConnection("127.0.0.1", appliance.ports["http"], timeout=30)
    yield connection
    connection.close()


def call(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPResponse, bytes]:
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    return response.status, response, response.read()


def tensor(name: str, array: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    value = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    value.set_data_from_numpy(array, binary_data=binary)
    return value


def simple_inputs() -> list[httpclient.InferInput]:
    return [tensor("INPUT0", SIMPLE_IN0, binary=False), tensor("INPUT1", SIMPLE_IN1)]


def assert_serving(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("simple", simple_inputs())
    assert np.array_equal(result.as_numpy("OUTPUT0"), SIMPLE_IN0 + SIMPLE_IN1)


def failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def infer_json(conn: http.client.HTTPConnection, model: str, doc: Any) -> tuple[int, Any]:
    status, _response, body = call(conn, "POST", f"/v2/models/{model}/infer", orjson.dumps(doc))
    return status, orjson.loads(body)


# -- health, metadata, configuration ----------------------------------------------


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "2")
    assert not client.is_model_ready("no_such_model")
    server = client.get_server_metadata()
    assert server["name"] == "triton"
    assert "binary_tensor_data" in server["extensions"]
    assert "system_shared_memory" in server["extensions"]
    model = client.get_model_metadata("simple", query_params={"test_1": 1})
    assert model["versions"] == ["1"]
    assert model["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert client.get_model_metadata("simple", "1")["name"] == "simple"


def test_unknown_model_and_version(
    client: httpclient.InferenceServerClient, conn: http.client.HTTPConnection
) -> None:
    error = failure(lambda: client.get_model_metadata("wrong_model_name"))
    assert error.status() == "404"
    assert error.message() == "Request for unknown model: 'wrong_model_name' is not found"
    error = failure(lambda: client.infer("wrong_model_name", simple_inputs()))
    assert error.message().startswith("Request for unknown model")
    error = failure(lambda: client.infer("simple", simple_inputs(), model_version="2"))
    assert error.status() == "404"
    assert "'simple' version 2 is not found" in error.message()
    status, response, body = call(conn, "GET", "/v2/models/wrong_model_name/config")
    assert status == 404
    assert response.getheader("Content-Type") == "application/json"
    assert orjson.loads(body) == {
        "error": "Request for unknown model: 'wrong_model_name' is not found"
    }
    assert_serving(client)


def test_model_config_and_statistics(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple")
    assert config["max_batch_size"] == 8
    assert config["input"][0] == {
        "name": "INPUT0",
        "data_type": "TYPE_INT32",
        "dims": [16],
        "optional": False,
    }
    assert client.get_model_config("simple", "1")["name"] == "simple"
    client.infer("simple", simple_inputs())
    stats = client.get_inference_statistics("simple")["model_stats"]
    assert len(stats) == 1
    assert stats[0]["name"] == "simple"
    assert set(stats[0]["inference_stats"]) >= {"success", "fail", "queue", "compute_infer"}
    every = client.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in every] == [m["name"] for m in MODELS]


# -- inference ------------------------------------------------------------------------


def test_simple_as_the_example_client_does(client: httpclient.InferenceServerClient) -> None:
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    minus = -np.ones((1, 16), dtype=np.int32)
    inputs = [tensor("INPUT0", SIMPLE_IN0, binary=False), tensor("INPUT1", minus)]
    result = client.infer(
        "simple", inputs, outputs=outputs, query_params={"test_1": 1, "test_2": 2}, request_id="r1"
    )
    assert np.array_equal(result.as_numpy("OUTPUT0"), SIMPLE_IN0 + minus)
    assert np.array_equal(result.as_numpy("OUTPUT1"), SIMPLE_IN0 - minus)
    response = result.get_response()
    assert response["id"] == "r1"
    assert "data" in response["outputs"][1]
    assert "binary_data_size" in response["outputs"][0]["parameters"]
    result = client.infer("simple", inputs)
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    assert np.array_equal(result.as_numpy("OUTPUT1"), SIMPLE_IN0 - minus)


def test_strings_with_json_and_binary(client: httpclient.InferenceServerClient) -> None:
    numbers = np.array([[str(i).encode() for i in range(16)]], dtype=object)
    ones = np.array([[b"1"] * 16], dtype=object)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    inputs = [tensor("INPUT0", numbers), tensor("INPUT1", ones, binary=False)]
    result = client.infer("simple_string", inputs, outputs=outputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == list(range(1, 17))
    assert [int(x) for x in result.as_numpy("OUTPUT1")[0]] == list(range(-1, 15))
    for array in (
        np.array([["he\x00llo"] * 16], dtype=object),
        np.array([[b"\x00\x01\x02\x03"] * 16], dtype=object),
    ):
        for binary in (True, False):
            out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
            got = client.infer("simple_identity", [tensor("INPUT0", array, binary)], outputs=out)
            expected = [x if isinstance(x, bytes) else x.encode() for x in array.reshape(-1)]
            as_bytes = [
                x if isinstance(x, bytes) else x.encode()
                for x in got.as_numpy("OUTPUT0").reshape(-1)
            ]
            assert as_bytes == expected


def test_nul_bytes_are_escaped_in_json(conn: http.client.HTTPConnection) -> None:
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "BYTES", "shape": [1, 2], "data": [["a\u0000b", "é"]]}
        ],
        "outputs": [{"name": "OUTPUT0"}],
    }
    status, response, body = call(
        conn, "POST", "/v2/models/simple_identity/infer", orjson.dumps(doc)
    )
    assert status == 200
    assert b'"a\\u0000b"' in body
    assert orjson.loads(body)["outputs"][0]["data"] == ["a\u0000b", "é"]
    assert response.getheader("Inference-Header-Content-Length") is None


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
    "BYTES": np.array([[b"a", b"he\x00llo"], [b"\xc3\xa9", b""]], dtype=object),
}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_dtype_round_trips_through_echo(
    client: httpclient.InferenceServerClient, binary: bool
) -> None:
    inputs = [tensor(name, array, binary) for name, array in EVERY_DTYPE.items()]
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in EVERY_DTYPE]
    result = client.infer("echo", inputs, outputs=outputs)
    for name, array in EVERY_DTYPE.items():
        got = result.as_numpy(name)
        if name == "BYTES" and not binary:
            got = np.array([x.encode() for x in got.reshape(-1)], dtype=object).reshape(got.shape)
        assert (got.dtype, got.shape) == (array.dtype, array.shape), name
        assert np.array_equal(got, array), name


def test_nested_and_flat_json_data(conn: http.client.HTTPConnection) -> None:
    for data in ([[1.0, 2.0], [3.0, 4.0]], [1.0, 2.0, 3.0, 4.0]):
        doc = {
            "id": "n",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": data}],
            "parameters": {"binary_data_output": False},
        }
        status, reply = infer_json(conn, "identity", doc)
        assert status == 200
        assert reply["id"] == "n"
        assert reply["model_name"] == "identity"
        assert reply["model_version"] == "1"
        assert reply["outputs"] == [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 2], "data": [1.0, 2.0, 3.0, 4.0]}
        ]


def test_16_mib_tensor_both_ways(client: httpclient.InferenceServerClient) -> None:
    array = np.random.default_rng(5).random((4, 1 << 20), dtype=np.float32)
    result = client.infer("identity", [tensor("INPUT0", array)])
    assert np.array_equal(result.as_numpy("OUTPUT0"), array)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_and_responses(
    client: httpclient.InferenceServerClient, conn: http.client.HTTPConnection, algorithm: str
) -> None:
    array = np.arange(4096, dtype=np.float32).reshape(1, 4096)
    result = client.infer(
        "identity",
        [tensor("INPUT0", array)],
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    assert np.array_equal(result.as_numpy("OUTPUT0"), array)
    for count in (2, 400):  # a reply of about 100 bytes, and one of about 2.4 KiB
        data = list(range(count))
        inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, count], "data": data}]
        doc = orjson.dumps({"inputs": inputs})
        packed = gzip.compress(doc) if algorithm == "gzip" else zlib.compress(doc)
        headers = {"Content-Encoding": algorithm, "Accept-Encoding": algorithm}
        status, response, body = call(conn, "POST", "/v2/models/identity/infer", packed, headers)
        assert status == 200
        if count == 2:  # under http.compress_min_bytes (1 KiB): sent as it is
            assert response.getheader("Content-Encoding") is None
            plain = body
        else:
            assert response.getheader("Content-Encoding") == algorithm
            plain = gzip.decompress(body) if algorithm == "gzip" else zlib.decompress(body)
        assert orjson.loads(plain)["outputs"][0]["data"] == [float(x) for x in data]


def test_connection_is_kept_alive_across_errors(conn: http.client.HTTPConnection) -> None:
    good = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    for _ in range(2):
        assert call(conn, "GET", "/v2/health/ready")[0] == 200
        assert call(conn, "POST", "/v2/models/identity/infer", b"{not json")[0] == 400
        assert call(conn, "GET", "/v2/models/nope")[0] == 404
        assert infer_json(conn, "identity", good)[0] == 200
        assert call(conn, "POST", "/v2/models/identity/infer", b"")[0] == 400


BAD_REQUESTS: list[tuple[str, bytes, dict[str, str], str]] = [
    ("identity", b"{not json", {}, "not valid JSON"),
    ("identity", b"", {}, "not valid JSON"),
    ("identity", b"[1, 2]", {}, "must be a JSON object"),
    ("identity", b'{"inputs": 5}', {}, '"inputs"'),
    (
        "simple",
        orjson.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16},
                    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16},
                ]
            }
        ),
        {},
        "expected datatype INT32, got FP32",
    ),
    (
        "identity",
        orjson.dumps(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}
        ),
        {},
        "shape [3] does not match",
    ),
    (
        "identity",
        orjson.dumps(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2]}]}
        ),
        {},
        "2 values in data do not match shape [1, 3]",
    ),
    ("identity", b"{}", {"Inference-Header-Content-Length": "x"}, "must be a byte count"),
    (
        "identity",
        b'{"inputs": []}' + b"\x00" * 4,
        {"Inference-Header-Content-Length": "14"},
        "4 bytes of binary data",
    ),
    ("identity", b"{}", {"Inference-Header-Content-Length": "99"}, "does not fit"),
    ("identity", b"{}", {"Content-Encoding": "br"}, "unsupported Content-Encoding"),
    ("identity", b"garbage", {"Content-Encoding": "gzip"}, "not valid gzip"),
]


def test_bad_requests_are_400_and_name_the_problem(
    client: httpclient.InferenceServerClient, conn: http.client.HTTPConnection
) -> None:
    for model, body, headers, words in BAD_REQUESTS:
        status, _response, reply = call(conn, "POST", f"/v2/models/{model}/infer", body, headers)
        assert status == 400, (words, reply)
        assert words in orjson.loads(reply)["error"], (words, reply)
    assert_serving(client)


def test_byte_size_not_matching_the_shape(conn: http.client.HTTPConnection) -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 3],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        }
    )
    status, _response, reply = call(
        conn,
        "POST",
        "/v2/models/identity/infer",
        header + b"\x00" * 8,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400
    assert (
        "8 bytes of data do not match shape [1, 3] of FP32 (12 bytes expected)"
        in orjson.loads(reply)["error"]
    )


def test_non_utf8_bytes_cannot_travel_as_json(client: httpclient.InferenceServerClient) -> None:
    array = np.array([[b"\xff\xfe"]], dtype=object)
    out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    error = failure(lambda: client.infer("simple_identity", [tensor("INPUT0", array)], outputs=out))
    assert error.status() == "400"
    assert "not UTF-8" in error.message()
    assert_serving(client)


def test_too_large_a_body_is_413(appliance: Appliance) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", appliance.ports["http"], timeout=30)
    try:
        connection.putrequest("POST", "/v2/models/identity/infer")
        connection.putheader("Content-Length", str(LIMIT + 1))
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413
        assert "exceeds the limit" in orjson.loads(response.read())["error"]
    finally:
        connection.close()


def test_timeout_parameter_and_model_failure(client: httpclient.InferenceServerClient) -> None:
    x = tensor("x", np.ones(3, np.float32))
    started = time.monotonic()
    error = failure(lambda: client.infer("slow", [x], parameters={"sleep_s": 2.0}, timeout=300_000))
    assert error.status() == "504"
    assert time.monotonic() - started < 1.9
    error = failure(lambda: client.infer("slow", [x], parameters={"fail": True}))
    assert error.status() == "500"
    assert "asked to fail" in error.message()
    assert_serving(client)


def test_parameters_reach_the_model(client: httpclient.InferenceServerClient) -> None:
    x = tensor("x", np.zeros(1, np.float32))
    params = {"flag": True, "count": -5, "text": "hé", "ratio": 0.25}
    result = client.infer("params", [x], parameters=params)
    assert orjson.loads(result.as_numpy("parameters")[0]) == params


def test_load_with_an_override_config(client: httpclient.InferenceServerClient) -> None:
    malformed = '"parameters": {"config": {{"max_batch_size": "16"}}}'
    error = failure(lambda: client.load_model("simple", config=malformed))
    assert "failed to load" in error.message()
    assert "not valid JSON" in error.message()
    assert error.status() == "400"
    error = failure(lambda: client.load_model("simple", config='{"input": []}'))
    assert "input" in error.message()
    assert error.status() == "400"
    client.load_model("simple", config='{"max_batch_size":"16"}')
    assert client.get_model_config("simple")["max_batch_size"] == 16
    client.load_model("simple")
    assert client.get_model_config("simple")["max_batch_size"] == 8


def test_repository_index_and_model_control(client: httpclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    # By name, as Triton lists them.
    assert [(m["name"], m["version"], m["state"]) for m in index] == sorted(
        (m["name"], "1", "READY") for m in MODELS
    )
    client.load_model("simple")
    error = failure(lambda: client.load_model("wrong_model_name"))
    assert "failed to load" in error.message()
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    unloaded = {m["name"]: m for m in client.get_model_repository_index()}["simple"]
    assert (unloaded["state"], unloaded["reason"]) == ("UNAVAILABLE", "unloaded")
    client.load_model("simple")
    assert client.is_model_ready("simple")


def test_unserved_endpoints_answer_in_kserve_form(
    client: httpclient.InferenceServerClient, conn: http.client.HTTPConnection
) -> None:
    error = failure(lambda: client.get_log_settings())
    assert error.status() == "404"
    assert "GET /v2/logging is not an endpoint" in error.message()
    status, _response, body = call(conn, "GET", "/v2/")
    assert status == 200
    assert orjson.loads(body)["name"] == "triton"


def test_cuda_shared_memory_on_a_cpu_only_server(client: httpclient.InferenceServerClient) -> None:
    if not cuda_driver_missing():
        pytest.skip("a GPU is usable here: tests/system/test_cuda_shm.py covers CUDA shm")
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("anything")
    assert client.get_cuda_shared_memory_status() == []
    error = failure(lambda: client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64))
    assert error.status() == "501"
    assert "CPU-only" in error.message()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"raw_handle": "aGFuZGxl", "byte_size": 64}', 'register needs {"raw_handle": {"b64"'),
        (b'{"raw_handle": {"b64": "not base64!"}, "byte_size": 64}', "not base64"),
        (b'{"raw_handle": {"b64": "aGFuZGxl"}, "device_id": "0", "byte_size": 64}', "register"),
    ],
)
def test_a_malformed_cuda_registration_is_a_400_that_says_what_is_expected(
    conn: http.client.HTTPConnection, body: bytes, words: str
) -> None:
    status, _response, reply = call(conn, "POST", "/v2/cudasharedmemory/region/r/register", body)
    assert status == 400
    assert words in orjson.loads(reply)["error"]


def test_readiness_follows_the_master(
    appliance: Appliance, client: httpclient.InferenceServerClient
) -> None:
    appliance.ctl("offline")
    try:
        deadline = time.monotonic() + 5
        while client.is_server_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not client.is_server_ready()
        assert not client.is_model_ready("simple")
        assert client.is_server_live()
        assert_serving(client)
    finally:
        appliance.ctl("online")
    deadline = time.monotonic() + 5
    while not client.is_server_ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.is_server_ready()
