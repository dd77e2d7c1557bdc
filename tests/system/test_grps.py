"""GRPS over REST against a real appliance: every route, payload kind and error.

One test streams over gRPC too: streams in flight on both transports.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import yaml

from appliance._generated import grps_pb2, grps_pb2_grpc
from appliance.client.api import ModelClient
from tests.system.harness import Appliance, demo_models, eventually, rendezvous, running

MODELS = ("simple", "simple_identity", "forward", "digits", "echo")
JSON = {"Content-Type": "application/json"}
OK = {"code": 200, "msg": "OK", "status": "SUCCESS"}


@pytest.fixture(scope="module")
def grps() -> Iterator[Appliance]:
    # The default config's default model is echo; the harness sets none.
    with running(demo_models(*MODELS), server={"default_model": "echo"}) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def url(appliance: Appliance, path: str) -> str:
    return f"http://127.0.0.1:{appliance.ports['http']}{path}"


def predict(
    session: requests.Session, appliance: Appliance, body: Any, query: str = "", **kwargs: Any
) -> requests.Response:
    return session.post(
        url(appliance, f"/grps/v1/infer/predict{query}"),
        data=json.dumps(body),
        headers=JSON,
        timeout=30,
        **kwargs,
    )


def ok_json(response: requests.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json;charset=utf-8"
    doc: dict[str, Any] = response.json()
    assert doc["status"] == OK
    return doc


def failure(response: requests.Response, code: int, *words: str) -> str:
    """Check a GRPS failure: the HTTP status equals status.code, as in GRPS's py server."""
    assert response.status_code == code, response.text
    status = response.json()["status"]
    assert status["status"] == "FAILURE"
    assert status["code"] == code
    for word in words:
        assert word in status["msg"]
    return str(status["msg"])


# -- health ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("route", ["live", "ready"])
def test_health_routes_answer_ok(
    grps: Appliance, session: requests.Session, method: str, route: str
) -> None:
    response = session.request(method, url(grps, f"/grps/v1/health/{route}"), timeout=10)
    assert ok_json(response) == {"status": OK}


def http_ready(session: requests.Session, appliance: Appliance, path: str) -> int:
    return session.get(url(appliance, path), timeout=10).status_code


def test_offline_drains_every_protocol_and_online_restores(
    grps: Appliance, session: requests.Session
) -> None:
    try:
        assert ok_json(session.get(url(grps, "/grps/v1/health/offline"), timeout=10))
        response = session.post(url(grps, "/grps/v1/health/ready"), timeout=10)
        failure(response, 503, "Service Unavailable")
        # One flag for the host: KServe's readiness follows GRPS offline.
        assert http_ready(session, grps, "/v2/health/ready") == 503
        assert http_ready(session, grps, "/grps/v1/health/live") == 200
        # Offline never drops a request that still arrives.
        assert ok_json(predict(session, grps, {"str_data": "still served"}))["str_data"] == (
            "still served"
        )
    finally:
        assert ok_json(session.post(url(grps, "/grps/v1/health/online"), timeout=10))
    assert ok_json(session.get(url(grps, "/grps/v1/health/ready"), timeout=10))
    assert http_ready(session, grps, "/v2/health/ready") == 200


# -- predict: every payload kind ---------------------------------------------------


def test_the_calls_of_grps_example_http_client(grps: Appliance, session: requests.Session) -> None:
    """The requests GRPS's template client (client/python/http_client.py) makes, in order."""
    base = url(grps, "/grps/v1")
    assert session.get(f"{base}/health/live").json()["status"] == OK
    assert session.get(f"{base}/health/online").json()["status"] == OK
    assert session.get(f"{base}/health/ready").json()["status"] == OK
    reply = session.post(f"{base}/infer/predict", json={"str_data": "hello grps."}).json()
    assert reply == {"status": OK, "str_data": "hello grps."}
    streamed = session.post(
        f"{base}/infer/predict?streaming=true", json={"str_data": "hello grps."}, stream=True
    )
    chunks = [json.loads(chunk) for chunk in streamed.iter_content(chunk_size=None)]
    assert "".join(chunk["str_data"] for chunk in chunks) == "hello grps."
    tensor = {
        "name": "inp",
        "dtype": "DT_FLOAT32",
        "shape": [2, 3],
        "flat_float32": [1, 2, 3, 4, 5, 6],
    }
    reply = session.post(f"{base}/infer/predict", json={"gtensors": {"tensors": [tensor]}}).json()
    assert reply["gtensors"]["tensors"] == [tensor]
    gmap = {
        "s_s": {"key": "value"},
        "s_b": {"key": base64.b64encode(b"hello grps.").decode()},
        "s_i32": {"key": 1},
        "s_i64": {"key": "1"},
        "s_f": {"key": 1.0},
        "s_d": {"key": 1.0},
    }
    # The example also sends an "s_t" map grps.proto lacks; GRPS ignores it too.
    s_t = {"key": {"dtype": "DT_FLOAT32", "shape": [1], "flat_float32": [1]}}
    reply = session.post(f"{base}/infer/predict", json={"gmap": gmap | {"s_t": s_t}}).json()
    assert reply == {"status": OK, "gmap": gmap}
    reply = session.post(
        f"{base}/infer/predict?return-ndarray=true", json={"ndarray": [[1, 2, 3], [4, 5, 6]]}
    ).json()
    assert reply == {"status": OK, "ndarray": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]}
    reply = session.post(
        f"{base}/infer/predict",
        data="hello grps.",
        headers={"content-type": "application/octet-stream"},
    )
    assert reply.content == b"hello grps."
    assert yaml.safe_load(session.get(f"{base}/metadata/server").json()["str_data"])
    reply = session.post(f"{base}/metadata/model", json={"str_data": "your_model"})
    failure(reply, 404, "your_model")


def test_str_data_goes_to_the_default_model(grps: Appliance, session: requests.Session) -> None:
    doc = ok_json(predict(session, grps, {"str_data": "hello grps"}))
    assert doc == {"status": OK, "str_data": "hello grps"}


def test_bin_data_travels_as_octet_stream_both_ways(
    grps: Appliance, session: requests.Session
) -> None:
    body = bytes(range(256)) * 3
    response = session.post(
        url(grps, "/grps/v1/infer/predict"),
        data=body,
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/octet-stream"
    assert response.content == body


def test_the_documented_gtensors_request_comes_back_whole(
    grps: Appliance, session: requests.Session
) -> None:
    # SPEC: grps.md "Infer接口" — the doc's example, with its "flat_double".
    tensors = [
        {"name": "in1", "dtype": "DT_INT32", "shape": [3, 2], "flat_int32": [1, 2, 3, 4, 5, 6]},
        {"name": "in2", "dtype": "DT_FLOAT64", "shape": [3, 3], "flat_double": list(range(1, 10))},
    ]
    doc = ok_json(predict(session, grps, {"gtensors": {"tensors": tensors}}))
    first, second = doc["gtensors"]["tensors"]
    assert first == tensors[0]
    assert second["flat_float64"] == [float(x) for x in range(1, 10)]
    assert (second["dtype"], second["shape"]) == ("DT_FLOAT64", [3, 3])


def test_unnamed_gtensors_take_the_declared_names(
    grps: Appliance, session: requests.Session
) -> None:
    a, b = list(range(16)), [1] * 16
    tensors = [
        {"dtype": 4, "shape": [1, 16], "flat_int32": a},
        {"dtype": "DT_INT32", "shape": [1, 16], "flat_int32": b},
    ]
    doc = ok_json(predict(session, grps, {"model": "simple", "gtensors": {"tensors": tensors}}))
    out = {t["name"]: t["flat_int32"] for t in doc["gtensors"]["tensors"]}
    assert out == {"OUTPUT0": [x + 1 for x in a], "OUTPUT1": [x - 1 for x in a]}


def test_int64_values_are_json_strings(grps: Appliance, session: requests.Session) -> None:
    tensor = {
        "name": "big",
        "dtype": "DT_INT64",
        "shape": [2],
        "flat_int64": ["9007199254740993", -1],
    }
    doc = ok_json(predict(session, grps, {"gtensors": {"tensors": [tensor]}}))
    assert doc["gtensors"]["tensors"][0]["flat_int64"] == ["9007199254740993", "-1"]


def test_ndarray_reaches_the_single_float_input(grps: Appliance, session: requests.Session) -> None:
    pixels = np.zeros((2, 64)).tolist()
    doc = ok_json(predict(session, grps, {"ndarray": pixels}, "?model=digits&return-ndarray=true"))
    probabilities = np.array(doc["ndarray"])
    assert probabilities.shape == (2, 10)
    assert np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
    assert "gtensors" not in doc
    # Without return-ndarray the reply is gtensors, as in GRPS; FP64 inputs are cast.
    doc = ok_json(predict(session, grps, {"ndarray": [[3]]}, "?model=forward"))
    assert doc["gtensors"]["tensors"][0] == {
        "name": "y",
        "dtype": "DT_FLOAT64",
        "shape": [1, 1],
        "flat_float64": [6.0],
    }
    doc = ok_json(predict(session, grps, {"ndarray": [[1.5, 2], [3, 4]]}, "?return-ndarray=TRUE"))
    assert doc["ndarray"] == [[1.5, 2.0], [3.0, 4.0]]


def test_gmap_comes_back_faithfully_from_echo(grps: Appliance, session: requests.Session) -> None:
    gmap = {
        "s_s": {"text": "héllo"},
        "s_b": {"raw": base64.b64encode(b"\x00\xffabc").decode(), "ascii": "YWJj"},
        "s_i32": {"count": -3},
        "s_i64": {"big": "9007199254740993"},
        "s_f": {"ratio": 0.25},
        "s_d": {"precise": 0.1},
    }
    doc = ok_json(predict(session, grps, {"gmap": gmap}))
    assert doc["gmap"] == gmap


def test_gmap_feeds_declared_inputs_by_key(grps: Appliance, session: requests.Session) -> None:
    doc = ok_json(predict(session, grps, {"model": "forward", "gmap": {"s_i32": {"x": 4}}}))
    assert doc["gmap"] == {"s_d": {"y": 8.0}}


def test_str_data_feeds_a_single_bytes_input(grps: Appliance, session: requests.Session) -> None:
    doc = ok_json(predict(session, grps, {"str_data": "a\u0000b"}, "?model=simple_identity"))
    assert doc["str_data"] == "a\u0000b"


@pytest.mark.parametrize(
    ("query", "model", "found"),
    [
        ("?model=simple", "echo", True),  # the payload's model wins
        ("?model=echo-1", "", True),
        ("", "echo-1", True),
        ("?model=simple", "", False),  # simple cannot take str_data
    ],
)
def test_model_selection(
    grps: Appliance, session: requests.Session, query: str, model: str, found: bool
) -> None:
    body = {"str_data": "pick me"} | ({"model": model} if model else {})
    response = predict(session, grps, body, query)
    if found:
        assert ok_json(response)["str_data"] == "pick me"
    else:
        failure(response, 400, "model simple takes tensors INPUT0, INPUT1", "send gtensors")


# -- errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "body", "code", "words"),
    [
        ({}, b'{"str_data": "x"}', 400, ("No content type",)),
        ({"Content-Type": "application/json; charset=utf-8"}, b"{}", 400, ("Unsupported content",)),
        ({"Content-Type": "text/plain"}, b"x", 400, ("Unsupported content",)),
        (JSON, b"", 400, ("The http body is empty.",)),
        (JSON, b'{"str_data": ', 400, ("not valid JSON",)),
        (JSON, b"[1, 2]", 400, ("JSON object",)),
        (JSON, b'{"model": "echo"}', 400, ("carries no data",)),
        (JSON, b'{"str_data": "x", "model": "nope"}', 404, ("unknown model", "'nope'")),
        (JSON, b'{"str_data": "x", "model": "echo-7"}', 404, ("echo has version 1",)),
        (JSON, b'{"ndarray": [[1, 2], [3]]}', 400, ("rectangular",)),
        (JSON, b'{"ndarray": [[1, 2]], "model": "simple"}', 400, ("send gtensors",)),
        (JSON, b'{"ndarray": [[1, 2]], "model": "digits"}', 400, ("[1, 2]", "[-1, 64]")),
        (
            JSON,
            b'{"model": "simple", "gtensors": {"tensors": [{"name": "INPUT0", "dtype": '
            b'"DT_FLOAT32", "shape": [1, 16], "flat_float32": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]},'
            b'{"name": "INPUT1", "dtype": 4, "shape": [1, 16], "flat_int32": '
            b"[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}}",
            400,
            ("INPUT0", "INT32", "FP32"),
        ),
        (
            JSON,
            b'{"model": "simple", "gtensors": {"tensors": [{"dtype": 4, "shape": [1, 2], '
            b'"flat_int32": [1, 2]}, {"dtype": 4, "shape": [1, 2], "flat_int32": [1, 2]}]}}',
            400,
            ("shape [1, 2]", "[-1, 16]"),
        ),
        (
            JSON,
            b'{"gtensors": {"tensors": [{"dtype": 4, "shape": [2], "flat_int32": [1]}]}}',
            400,
            ("holds 2 elements",),
        ),
    ],
)
def test_errors_are_a_failure_status_and_the_server_keeps_serving(
    grps: Appliance,
    session: requests.Session,
    headers: dict[str, str],
    body: bytes,
    code: int,
    words: tuple[str, ...],
) -> None:
    response = session.post(
        url(grps, "/grps/v1/infer/predict"), data=body, headers=headers, timeout=30
    )
    failure(response, code, *words)
    assert ok_json(predict(session, grps, {"str_data": "alive"}))["str_data"] == "alive"


def test_wrong_method_and_flag_combinations(grps: Appliance, session: requests.Session) -> None:
    failure(session.get(url(grps, "/grps/v1/infer/predict"), timeout=10), 405, "POST")
    failure(session.get(url(grps, "/grps/v1/metadata/model"), timeout=10), 405, "POST")
    response = predict(session, grps, {"str_data": "x"}, "?streaming=true&return-ndarray=true")
    failure(response, 400, "cannot be used together")
    response = predict(session, grps, {"str_data": "x"}, "?return-ndarray=true")
    failure(response, 500, "floating-point output")


# -- metadata ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_server_metadata_is_yaml(grps: Appliance, session: requests.Session, method: str) -> None:
    doc = ok_json(session.request(method, url(grps, "/grps/v1/metadata/server"), timeout=10))
    meta = yaml.safe_load(doc["str_data"])
    assert meta["server"]["default_model"] == "echo"
    assert [model["name"] for model in meta["models"]] == list(MODELS)


def test_model_metadata_is_yaml(grps: Appliance, session: requests.Session) -> None:
    endpoint = url(grps, "/grps/v1/metadata/model")
    doc = ok_json(session.post(endpoint, json={"str_data": "simple"}, timeout=10))
    meta = yaml.safe_load(doc["str_data"])
    assert meta["name"] == "simple"
    assert meta["version"] == "1"
    assert meta["inputs"][0] == {
        "name": "INPUT0",
        "dtype": "DT_INT32",
        "datatype": "INT32",
        "shape": [-1, 16],
    }
    assert yaml.safe_load(ok_json(session.post(endpoint, json={"str_data": "echo-1"}))["str_data"])
    failure(session.post(endpoint, json={}, timeout=10), 400, "No model name")
    failure(session.post(endpoint, data=b"{oops", timeout=10), 400, "not valid JSON")
    failure(session.post(endpoint, json={"str_data": "nope"}, timeout=10), 404, "nope")


# -- streaming ---------------------------------------------------------------------


def stream_chunks(
    session: requests.Session, appliance: Appliance, body: Any, query: str
) -> Iterator[tuple[float, dict[str, Any]]]:
    """Yield (arrival time, message) for each HTTP chunk."""
    response = predict(session, appliance, body, query, stream=True)
    assert response.status_code == 200
    assert response.headers["Transfer-Encoding"] == "chunked"
    assert response.headers["Content-Type"] == "application/octet-stream"
    for chunk in response.raw.read_chunked():
        yield time.monotonic(), json.loads(chunk)


def test_streaming_sends_each_part_as_it_is_produced(
    grps: Appliance, session: requests.Session
) -> None:
    query = "?streaming=true&chunks=3&chunk_delay_s=1.0"
    parts = list(stream_chunks(session, grps, {"str_data": "hello streaming grps"}, query))
    assert len(parts) == 3
    assert all(message["status"] == OK for _t, message in parts)
    assert "".join(message["str_data"] for _t, message in parts) == "hello streaming grps"
    # The first chunk arrived about two delays before the last was produced.
    assert parts[-1][0] - parts[0][0] > 1.0


def test_streaming_keeps_utf8_characters_whole(grps: Appliance, session: requests.Session) -> None:
    text = "é" * 5  # 10 bytes: echo cuts them into 4 + 4 + 2, splitting no character
    parts = list(stream_chunks(session, grps, {"str_data": text}, "?streaming=true&chunks=4"))
    assert "".join(message["str_data"] for _t, message in parts) == text


def test_streaming_gtensors_and_models_that_do_not_stream(
    grps: Appliance, session: requests.Session
) -> None:
    tensor = {"name": "x", "dtype": "DT_FLOAT32", "shape": [6], "flat_float32": [1, 2, 3, 4, 5, 6]}
    parts = list(
        stream_chunks(session, grps, {"gtensors": {"tensors": [tensor]}}, "?streaming=true")
    )
    values = [v for _t, m in parts for v in m["gtensors"]["tensors"][0]["flat_float32"]]
    assert values == [1, 2, 3, 4, 5, 6]
    body = {"model": "forward", "ndarray": [[2]]}
    (only,) = list(stream_chunks(session, grps, body, "?streaming=true"))
    assert only[1]["gtensors"]["tensors"][0]["flat_float64"] == [4.0]


def test_streaming_errors_before_output_are_plain_failures(
    grps: Appliance, session: requests.Session
) -> None:
    response = predict(session, grps, {"model": "nope", "str_data": "x"}, "?streaming=true")
    failure(response, 404, "nope")


def echo_depth(client: ModelClient) -> int:
    """Requests queued or running (streams included) in echo's worker."""
    return sum(client.status.read(slot).depth for slot in client.router.slots["echo"])


def test_a_client_that_leaves_stops_the_models_stream(
    grps: Appliance, session: requests.Session
) -> None:
    client = grps.client()
    query = "?streaming=true&chunks=40&chunk_delay_s=0.25"  # 10 s if nobody stops it
    response = predict(session, grps, {"str_data": "x" * 40}, query, stream=True)
    chunks = response.raw.read_chunked()
    assert json.loads(next(chunks))["status"] == OK
    assert eventually(lambda: echo_depth(client) == 1, 2.0)
    response.close()  # the connection goes away mid-stream
    assert eventually(lambda: echo_depth(client) == 0, 5.0)


def test_streams_in_flight_are_not_capped_by_the_frontend_threads(tmp_path: Path) -> None:
    # One thread in each frontend's pool, two streams that each wait for the
    # other at a model: they pass only if both reach the models at once.
    with (
        running(
            [rendezvous(tmp_path)], http={"workers": 1, "threads": 1}, grpc={"threads": 1}
        ) as appliance,
        grpc.insecure_channel(f"127.0.0.1:{appliance.ports['grpc']}") as channel,
    ):
        stub = grps_pb2_grpc.GrpsServiceStub(channel)

        def over_rest(index: int) -> float:
            tensor = {"name": "x", "dtype": "DT_FLOAT64", "shape": [1], "flat_float64": [index]}
            body = {"model": "rendezvous", "gtensors": {"tensors": [tensor]}}
            with requests.Session() as session:
                [(_t, message)] = stream_chunks(
                    session, appliance, body, "?streaming=true&round=rest"
                )
            return float(message["gtensors"]["tensors"][0]["flat_float64"][0])

        def over_grpc(index: int) -> float:
            request = grps_pb2.GrpsMessage(model="rendezvous")
            request.gtensors.tensors.add(
                name="x", dtype=grps_pb2.DT_FLOAT64, shape=[1], flat_float64=[index]
            )
            [reply] = stub.PredictStreaming(request, metadata=[("round", "grpc")], timeout=60)
            assert reply.status.code == 200, reply.status.msg
            return float(reply.gtensors.tensors[0].flat_float64[0])

        for call in (over_rest, over_grpc):
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                assert list(pool.map(call, [1, 2])) == [1.0, 2.0]


# -- the page ----------------------------------------------------------------------


def test_the_page_shows_state_and_traffic_and_loads_nothing_else(
    grps: Appliance, session: requests.Session
) -> None:
    # Traffic of its own, so the counters below do not depend on earlier tests.
    predict = url(grps, "/grps/v1/infer/predict")
    assert session.post(predict, json={"model": "echo", "str_data": "hi"}, timeout=10).ok
    response = session.get(url(grps, "/"), headers={"Accept": "text/html"}, timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/html")
    page = response.text
    assert "online" in page
    for model in MODELS:
        assert f"<td>{model}</td>" in page
    assert "http://" not in page
    assert "https://" not in page
    assert " src=" not in page

    # Workers publish their counters just after they answer.
    def monitored() -> Any:
        return session.get(url(grps, "/grps/v1/monitor/metrics"), timeout=10).json()

    def echo_of(metrics: Any) -> Any:
        return next(model for model in metrics["models"] if model["name"] == "echo")

    assert eventually(lambda: echo_of(monitored())["success"] > 0, 5.0)
    metrics = monitored()
    assert metrics["online"] is True
    echo = echo_of(metrics)
    assert echo["ready"]
    assert {process["role"] for process in metrics["processes"]} >= {"model", "http", "grpc"}
