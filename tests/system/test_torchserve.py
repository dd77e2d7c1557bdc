"""A TorchServe model store served by the appliance, started with torchserve's flags.

``appliance serve --model-store DIR --models all`` serves the archives as
TorchServe would: its inference API (/ping, /predictions, /explanations),
the management API's list of models, handlers unmodified (module-level
``handle``, a class with ``initialize``, extra files, the context's headers
and response status, batching from model-config.yaml), failures worded and
numbered as TorchServe's. The same archive answers KServe v2 too. The
comparison with TorchServe itself is tests/peers/test_torchserve_oracle.py.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from google.protobuf import empty_pb2

from appliance._generated import (
    torchserve_inference_pb2,
    torchserve_inference_pb2_grpc,
    torchserve_management_pb2,
    torchserve_management_pb2_grpc,
)
from appliance.config.tokens import expiration_epoch
from tests.system.harness import Appliance, serving_repository
from tests.system.model_store import serving_model_store
from tests.torch_archives import write_script_mar
from tests.torchserve_models import (
    BATCH_CONFIG,
    BATCH_HANDLER,
    ECHO_HANDLER,
    INSPECT_HANDLER,
    LABELS,
    LABELS_HANDLER,
    METRICS_HANDLER,
    RAISING_HANDLER,
    STREAM_HANDLER,
    WRONG_LENGTH_HANDLER,
    write_mar,
    write_model_dir,
)

TIMEOUT = 30


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Appliance]]:
    store = tmp_path_factory.mktemp("model-store")
    write_mar(store, "echo", ECHO_HANDLER)
    write_mar(store, "inspect", INSPECT_HANDLER, version="2.0")
    write_model_dir(
        store, "labels", LABELS_HANDLER, extra_files={"labels.json": json.dumps(LABELS)}
    )
    write_mar(store, "wrong", WRONG_LENGTH_HANDLER)
    write_mar(store, "raising", RAISING_HANDLER)
    write_mar(store, "batch", BATCH_HANDLER, config_yaml=BATCH_CONFIG)
    write_script_mar(store, tmp_path_factory.mktemp("scripted"))
    write_mar(store, "stream", STREAM_HANDLER)
    write_mar(store, "metrics", METRICS_HANDLER)
    temp = tmp_path_factory.mktemp("tmp")
    with serving_model_store(store, env={"TMPDIR": str(temp)}) as appliance:
        yield f"http://127.0.0.1:{appliance.ports['http']}", appliance
    # Each instance unpacked its archive into a directory of its own, and removed it.
    assert not list(temp.glob("appliance-ts-*"))


def _error(code: int, kind: str, message: str) -> bytes:
    body = {"code": code, "type": kind, "message": message}
    return json.dumps(body, indent=2).encode() + b"\n"


def test_ping_and_the_model_list_answer_as_torchserve_s(served: tuple[str, Appliance]) -> None:
    base, appliance = served
    ping = requests.get(f"{base}/ping", timeout=TIMEOUT)
    assert (ping.status_code, ping.content) == (200, b'{\n  "status": "Healthy"\n}\n')
    assert ping.headers["x-request-id"]
    listed = requests.get(f"{base}/models", timeout=TIMEOUT).json()
    assert [m["modelName"] for m in listed["models"]] == sorted(
        ["batch", "echo", "inspect", "labels", "metrics", "raising", "scripted", "stream", "wrong"]
    )
    assert {m["modelName"]: m["modelUrl"] for m in listed["models"]}["echo"] == "echo.mar"
    page = requests.get(f"{base}/models?limit=4", timeout=TIMEOUT).json()
    assert (len(page["models"]), page["nextPageToken"]) == (4, "4")
    rest = requests.get(f"{base}/models?limit=4&next_page_token=4", timeout=TIMEOUT).json()
    assert [m["modelName"] for m in rest["models"]] == ["metrics", "raising", "scripted", "stream"]
    assert rest["nextPageToken"] == "8"
    last = requests.get(f"{base}/models?limit=4&next_page_token=8", timeout=TIMEOUT).json()
    assert [m["modelName"] for m in last["models"]] == ["wrong"]
    assert "nextPageToken" not in last
    # The management port answers the management API alone, as TorchServe's 8081.
    management = f"http://127.0.0.1:{appliance.ports['management']}"
    assert requests.get(f"{management}/models", timeout=TIMEOUT).json() == listed
    assert requests.get(f"{management}/ping", timeout=TIMEOUT).status_code == 404


def test_a_module_level_handle_gets_json_parsed_text_as_str_and_bytes_as_they_are(
    served: tuple[str, Appliance],
) -> None:
    base, _ = served
    answer = requests.post(f"{base}/predictions/echo", json={"a": [1, 2]}, timeout=TIMEOUT)
    # A dict returned is JSON with an indent of 2, as TorchServe's worker encodes it.
    assert (answer.status_code, answer.content) == (200, b'{\n  "a": [\n    1,\n    2\n  ]\n}')
    text = requests.post(
        f"{base}/predictions/echo",
        data="héllo".encode(),
        headers={"Content-Type": "text/plain; charset=utf-8"},
        timeout=TIMEOUT,
    )
    assert text.content == "héllo".encode()
    raw = bytes(range(256))
    # curl -T sends PUT; the version may be named.
    put = requests.put(f"{base}/predictions/echo/1.0", data=raw, timeout=TIMEOUT)
    assert (put.status_code, put.content) == (200, raw)
    # KServe v1's path reaches the same handler, with the body as it is.
    v1 = requests.post(f"{base}/v1/models/echo:predict", json={"instances": [1]}, timeout=TIMEOUT)
    assert (v1.status_code, json.loads(v1.content)) == (200, {"instances": [1]})


def test_unknown_models_and_versions_answer_torchserve_s_404(
    served: tuple[str, Appliance],
) -> None:
    base, _ = served
    missing = requests.post(f"{base}/predictions/nope", data=b"x", timeout=TIMEOUT)
    assert (missing.status_code, missing.content) == (
        404,
        _error(404, "ModelNotFoundException", "Model not found: nope"),
    )
    version = requests.post(f"{base}/predictions/echo/9.9", data=b"x", timeout=TIMEOUT)
    assert (version.status_code, version.content) == (
        404,
        _error(
            404,
            "ModelVersionNotFoundException",
            "Model version: 9.9 does not exist for model: echo",
        ),
    )


def test_form_fields_headers_and_the_url_path_reach_the_handler(
    served: tuple[str, Appliance],
) -> None:
    base, _ = served
    answer = requests.post(
        f"{base}/explanations/inspect/2.0/extra/path",
        files={"data": ("a.json", b'{"x": 1}', "application/json")},
        data={"plain": "v"},
        headers={"X-Tag": "t1"},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 200, answer.text
    seen = answer.json()
    assert seen["fields"] == {
        "data": {"type": "dict", "value": {"x": 1}},
        "plain": {"type": "bytearray", "text": "v"},
    }
    headers = seen["headers"]
    assert (headers["x-tag"], headers["url_path"], headers["explain"]) == (
        "t1",
        "extra/path",
        "True",
    )
    assert headers["data"] == {"content-type": "application/json"}
    assert seen["batch"] == 1
    assert seen["request_id"] == answer.headers["x-request-id"]


def test_a_class_handler_reads_its_extra_file_and_sets_its_status_and_headers(
    served: tuple[str, Appliance],
) -> None:
    base, _ = served
    answer = requests.post(
        f"{base}/predictions/labels",
        data=b"2",
        headers={"x-want-status": "201", "x-tag": "T"},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 201
    assert answer.headers["x-labels"] == "3"
    assert answer.json() == {
        "key": "2",
        "label": "two",
        "model": "labels",
        "version": "1.0",
        # Any case of a header's name finds it (the HTTP stack lowers them).
        "get_request_header(i, 'x-tag')": "T",
        "get_request_header(i, 'X-Tag')": "T",
        "batch_size": 1,
        "server": "MMS",
        "server_version": "0.12.0",
    }


def test_handler_failures_answer_with_torchserve_s_words_and_statuses(
    served: tuple[str, Appliance],
) -> None:
    base, appliance = served
    cases = [
        ("wrong", {}, 503, "number of batch response mismatched"),
        ("raising", {}, 503, "Prediction failed"),
        ("raising", {"x-raise": "prediction"}, 418, "told to fail"),
    ]
    for model, headers, status, message in cases:
        answer = requests.post(
            f"{base}/predictions/{model}", data=b"1", headers=headers, timeout=TIMEOUT
        )
        assert (answer.status_code, answer.content) == (
            status,
            _error(status, "InternalServerException", message),
        ), model
    # The instance keeps serving, and its log has the handler's traceback.
    assert requests.post(f"{base}/predictions/echo", data=b"ok", timeout=TIMEOUT).content == b"ok"
    assert "ValueError: the handler raised on purpose" in appliance.log()


def test_four_concurrent_requests_reach_a_batch_4_handler_as_one_list(
    served: tuple[str, Appliance],
) -> None:
    base, _ = served
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda _: requests.post(f"{base}/predictions/batch", data=b"x", timeout=TIMEOUT),
                range(4),
            )
        )
    seen = [answer.json() for answer in answers]
    assert all(item["batch_size"] == 4 for item in seen)
    # maxBatchDelay 200 ms gathers all four (this host may split them under load).
    assert sum(item["batch"] for item in seen) >= 4 + 2


def test_a_torchscript_model_under_basehandler_batches_as_its_model_config_says(
    served: tuple[str, Appliance],
) -> None:
    base, _ = served
    rows = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda row: requests.post(f"{base}/predictions/scripted", json=row, timeout=60),
                rows,
            )
        )
    seen = [answer.json() for answer in answers]
    assert [item["y"] for item in seen] == [[1.5, -1.5], [2.5, 0.0], [3.5, -0.25], [6.5, -0.75]]
    # batchSize 4 with maxBatchDelay 200 ms gathers them (this host may split them under load).
    assert max(item["batch"] for item in seen) >= 2


def test_the_same_archive_answers_kserve_v2(served: tuple[str, Appliance]) -> None:
    base, _ = served
    client = httpclient.InferenceServerClient(base.removeprefix("http://"))
    try:
        body = httpclient.InferInput("body", [1], "BYTES")
        body.set_data_from_numpy(np.array([b"over kserve"], dtype=object))
        result = client.infer("echo", [body])
        assert result.as_numpy("body").tolist() == [b"over kserve"]
        metadata = client.get_model_metadata("echo")
        assert (metadata["platform"], metadata["versions"]) == ("torchserve", ["1.0"])
    finally:
        client.close()


def test_torchserve_s_grpc_services_answer_inference_and_management(
    served: tuple[str, Appliance],
) -> None:
    _, appliance = served
    with grpc.insecure_channel(f"127.0.0.1:{appliance.ports['grpc']}") as channel:
        inference = torchserve_inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        health = inference.Ping(empty_pb2.Empty(), timeout=TIMEOUT)
        assert json.loads(health.health) == {"status": "Healthy"}
        request = torchserve_inference_pb2.PredictionsRequest
        answer = inference.Predictions(
            request(model_name="echo", input={"body": b"over grpc"}), timeout=TIMEOUT
        )
        assert answer.prediction == b"over grpc"
        streamed = inference.StreamPredictions(
            request(model_name="echo", model_version="1.0", input={"data": b"s"}),
            timeout=TIMEOUT,
        )
        assert [part.prediction for part in streamed] == [b"s"]
        for model, code, message in (
            ("nope", grpc.StatusCode.NOT_FOUND, "Model not found: nope"),
            ("raising", grpc.StatusCode.UNAVAILABLE, "Prediction failed"),
        ):
            with pytest.raises(grpc.RpcError) as failed:
                inference.Predictions(request(model_name=model, input={"body": b"x"}))
            assert (failed.value.code(), failed.value.details()) == (code, message)
    # Management on the second gRPC port, as TorchServe's 7071.
    with grpc.insecure_channel(f"127.0.0.1:{appliance.ports['grpc_management']}") as channel:
        manage = torchserve_management_pb2_grpc.ManagementAPIsServiceStub(channel)
        listed = manage.ListModels(torchserve_management_pb2.ListModelsRequest(limit=2))
        assert json.loads(listed.msg) == {
            "nextPageToken": "2",
            "models": [
                {"modelName": "batch", "modelUrl": "batch.mar"},
                {"modelName": "echo", "modelUrl": "echo.mar"},
            ],
        }
        described = manage.DescribeModel(
            torchserve_management_pb2.DescribeModelRequest(model_name="echo")
        )
        assert json.loads(described.msg)[0]["modelVersion"] == "1.0"
        with pytest.raises(grpc.RpcError) as failed:
            manage.DescribeModel(torchserve_management_pb2.DescribeModelRequest(model_name="x"))
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND


def test_an_archive_that_cannot_be_served_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    write_mar(store, "vision", "x = 1\n", handler_entry="image_classifier")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    with serving_repository(store) as appliance:
        base = f"http://127.0.0.1:{appliance.ports['http']}"
        answer = requests.post(f"{base}/predictions/vision", data=b"x", timeout=TIMEOUT)
        assert answer.status_code == 503
        refusal = answer.json()
        assert refusal["type"] == "ServiceUnavailableException"
        assert "built-in handler image_classifier" in refusal["message"]
        assert "torchvision" in refusal["message"]
        ping = requests.get(f"{base}/ping", timeout=TIMEOUT)
        assert (ping.status_code, ping.json()) == (500, {"status": "Unhealthy"})
    # Each failed load removed the archive it had unpacked.
    assert not list(temp.iterdir())


def test_a_streaming_handler_s_intermediate_responses_arrive_as_chunks(
    served: tuple[str, Appliance],
) -> None:
    base, _ = served
    with requests.post(f"{base}/predictions/stream", data=b"x", stream=True, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["transfer-encoding"] == "chunked"
        arrived = []
        for chunk in answer.iter_content(chunk_size=None):
            arrived.append((time.monotonic(), chunk))
    assert b"".join(chunk for _, chunk in arrived) == b"part0 part1 part2 last"
    # Each part came as it was sent (the handler sleeps 0.3 s between them).
    assert arrived[-1][0] - arrived[0][0] > 0.5


def test_the_management_api_registers_scales_describes_and_unregisters(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_mar(store, "echo", ECHO_HANDLER)
    write_mar(store, "later", ECHO_HANDLER, version="3.1")
    with serving_model_store(store, ["echo.mar"]) as appliance:
        management, http = appliance.ports["management"], appliance.ports["http"]
        api = f"http://127.0.0.1:{management}"
        base = f"http://127.0.0.1:{http}"
        # --models named one archive: the other is the store's, not registered.
        listed = requests.get(f"{api}/models", timeout=TIMEOUT).json()
        assert listed == {"models": [{"modelName": "echo", "modelUrl": "echo.mar"}]}
        assert requests.post(
            f"{base}/predictions/later", data=b"x", timeout=TIMEOUT
        ).status_code in (404, 503)
        registered = requests.post(
            f"{api}/models?url=later.mar&initial_workers=1&synchronous=true", timeout=120
        )
        assert (registered.status_code, registered.json()) == (
            200,
            {"status": 'Model "later" Version: 3.1 registered with 1 initial workers'},
        )
        assert (
            requests.post(f"{base}/predictions/later", data=b"hi", timeout=TIMEOUT).content == b"hi"
        )
        again = requests.post(f"{api}/models?url=later.mar&initial_workers=1", timeout=TIMEOUT)
        assert (again.status_code, again.json()["type"]) == (409, "ConflictStatusException")
        missing = requests.post(f"{api}/models?url=nowhere.mar", timeout=TIMEOUT)
        assert (missing.status_code, missing.json()["type"]) == (404, "ModelNotFoundException")
        scaled = requests.put(f"{api}/models/later?min_worker=2&synchronous=true", timeout=120)
        assert (scaled.status_code, scaled.json()) == (
            200,
            {"status": "Workers scaled to 2 for model: later"},
        )
        [described] = requests.get(f"{api}/models/later", timeout=TIMEOUT).json()
        assert (described["modelName"], described["modelVersion"]) == ("later", "3.1")
        assert described["modelUrl"] == "later.mar"
        assert [w["status"] for w in described["workers"]] == ["READY", "READY"]
        assert all(w["pid"] > 0 and w["memoryUsage"] > 0 for w in described["workers"])
        default = requests.put(f"{api}/models/later/3.1/set-default", timeout=TIMEOUT)
        assert default.json() == {
            "status": 'Default version successfully updated for model "later" to "3.1"'
        }
        wrong = requests.put(f"{api}/models/later/9/set-default", timeout=TIMEOUT)
        assert (wrong.status_code, wrong.json()["type"]) == (404, "ModelVersionNotFoundException")
        gone = requests.delete(f"{api}/models/later", timeout=120)
        assert (gone.status_code, gone.json()) == (200, {"status": 'Model "later" unregistered'})
        assert requests.get(f"{api}/models", timeout=TIMEOUT).json() == listed
        unknown = requests.delete(f"{api}/models/later", timeout=TIMEOUT)
        assert (unknown.status_code, unknown.json()["message"]) == (404, "Model not found: later")


def test_token_authorization_is_on_unless_disabled_with_its_keys_in_key_file_json(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    write_mar(store, "echo", ECHO_HANDLER)
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    with serving_model_store(store, token_auth=True, cwd=workdir) as appliance:
        http, management = appliance.ports["http"], appliance.ports["management"]
        # Where it was started from, as TorchServe writes it, readable by its owner alone.
        key_file = workdir / "key_file.json"
        assert key_file.stat().st_mode & 0o077 == 0
        keys = json.loads(key_file.read_text())
        assert set(keys) == {"management", "inference", "API"}
        base = f"http://127.0.0.1:{http}"
        refused = requests.post(f"{base}/predictions/echo", data=b"x", timeout=TIMEOUT)
        assert (refused.status_code, refused.content) == (
            400,
            _error(
                400,
                "InvalidKeyException",
                "Token Authorization failed. Token either incorrect, expired, or not provided "
                "correctly",
            ),
        )
        bearer = {"Authorization": f"Bearer {keys['inference']['key']}"}
        answer = requests.post(f"{base}/predictions/echo", data=b"x", headers=bearer, timeout=30)
        assert answer.content == b"x"
        manage = {"Authorization": f"Bearer {keys['management']['key']}"}
        api = f"http://127.0.0.1:{management}/models"
        assert requests.get(api, timeout=TIMEOUT).status_code == 400
        assert requests.get(api, headers=manage, timeout=TIMEOUT).status_code == 200
        # Each key opens its own API alone.
        assert requests.get(api, headers=bearer, timeout=TIMEOUT).status_code == 400
        wrong = requests.post(f"{base}/predictions/echo", data=b"x", headers=manage, timeout=30)
        assert wrong.status_code == 400
        # Both last an hour, as TorchServe's do.
        for kind in ("inference", "management"):
            expires = keys[kind]["expiration time"]
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", expires)
            left = expiration_epoch(expires) - time.time()
            assert 3500 < left <= 3600
        # The token API makes a new key with the API key; the old one is refused from then on.
        token_api = f"http://127.0.0.1:{management}/token"
        for who in (None, bearer, manage):
            refused = requests.get(f"{token_api}?type=inference", headers=who, timeout=TIMEOUT)
            assert (refused.status_code, refused.json()["message"]) == (
                400,
                "Token Authentication failed. Token either incorrect, expired, or not provided "
                "correctly",
            )
        by_api = {"Authorization": f"Bearer {keys['API']['key']}"}
        assert requests.get(token_api, headers=by_api, timeout=TIMEOUT).status_code == 400
        renewed = requests.get(f"{token_api}?type=inference", headers=by_api, timeout=TIMEOUT)
        assert (renewed.status_code, renewed.content) == (200, b"\n")
        assert renewed.headers["content-type"] == "application/json"
        after = json.loads(key_file.read_text())
        assert after["inference"]["key"] != keys["inference"]["key"]
        assert (after["management"], after["API"]) == (keys["management"], keys["API"])
        assert key_file.stat().st_mode & 0o077 == 0
        old = requests.post(f"{base}/predictions/echo", data=b"x", headers=bearer, timeout=30)
        assert old.status_code == 400
        new = {"Authorization": f"Bearer {after['inference']['key']}"}
        answer = requests.post(f"{base}/predictions/echo", data=b"y", headers=new, timeout=30)
        assert answer.content == b"y"
        # POST as well; a management key renewed opens the management API at once.
        renewed = requests.post(f"{token_api}?type=management", headers=by_api, timeout=30)
        assert renewed.status_code == 200
        manage = {
            "Authorization": f"Bearer {json.loads(key_file.read_text())['management']['key']}"
        }
        assert requests.get(api, headers=manage, timeout=TIMEOUT).status_code == 200
        # A health check needs no key, nor the metrics API (as TorchServe's).
        assert requests.get(f"{base}/ping", timeout=TIMEOUT).status_code == 200
        metrics = f"http://127.0.0.1:{appliance.ports['metrics']}/metrics"
        assert requests.get(metrics, timeout=TIMEOUT).status_code == 200
    assert not key_file.exists()


def test_torchserve_s_metric_families_are_on_the_metrics_port(
    served: tuple[str, Appliance],
) -> None:
    base, appliance = served
    for _ in range(2):
        requests.post(f"{base}/predictions/echo", data=b"m", timeout=TIMEOUT)
    text = requests.get(
        f"http://127.0.0.1:{appliance.ports['metrics']}/metrics", timeout=TIMEOUT
    ).text
    assert "# TYPE ts_inference_requests_total counter" in text
    assert "# TYPE ts_queue_latency_microseconds counter" in text
    [line] = [
        line
        for line in text.splitlines()
        if line.startswith('ts_inference_requests_total{model_name="echo",model_version="default"')
    ]
    assert float(line.rsplit(" ", 1)[1]) >= 2
    assert 'CPUUtilization{Level="Host",Hostname="' in text
    # TorchServe's APIs' answers by status class: the two predictions at least.
    [ok] = [line for line in text.splitlines() if line.startswith("Requests2XX{")]
    assert float(ok.rsplit(" ", 1)[1]) >= 2


def test_a_handler_s_own_metrics_are_on_the_metrics_port_as_torchserve_shows_them(
    served: tuple[str, Appliance],
) -> None:
    base, appliance = served
    url = f"http://127.0.0.1:{appliance.ports['metrics']}/metrics"

    def value(text: str, prefix: str) -> float:
        [line] = [line for line in text.splitlines() if line.startswith(prefix)]
        return float(line.rsplit(" ", 1)[1])

    before = requests.get(url, timeout=TIMEOUT).text
    for _ in range(2):
        answer = requests.post(f"{base}/predictions/metrics", data=b"1", timeout=TIMEOUT)
        assert answer.status_code == 200
    text = requests.get(url, timeout=TIMEOUT).text
    host = f'Hostname="{socket.gethostname()}",}}'
    model = 'ModelName="metrics",Level="Model",'
    # Counters add up (the one made at load too), by the names and units the handler gave.
    assert "# HELP HandleCallCount Torchserve prometheus counter metric with unit: Count" in text
    calls = "HandleCallCount{" + model + host
    assert value(text, calls) - (value(before, calls) if calls in before else 0) == 2
    assert value(text, "InitializeCallCount{" + model + host) == 1
    # The handler's own dimensions come first.
    assert 'RowsSeen{Kind="rows",' + model + host in text
    # Gauges hold the last value; TorchServe's default config's own units for its two.
    assert "# TYPE BodySize gauge" in text
    assert value(text, "BodySize{" + model + host) == 0.25
    assert "# HELP PredictionTime Torchserve prometheus gauge metric with unit: ms" in text
    assert value(text, "PredictionTime{" + model + host) > 0
    assert value(text, "HandlerTime{" + model + host) == 1.5
    # A histogram in the Java client's buckets: 50 lies above 10.
    assert value(text, "SomePercent_bucket{" + model + host[:-2] + ',le="10.0",}') == 0
    infinite = value(text, "SomePercent_bucket{" + model + host[:-2] + ',le="+Inf",}')
    assert infinite == value(text, "SomePercent_count{" + model + host) >= 2
    assert value(text, "SomePercent_sum{" + model + host) == 50 * infinite


def test_hostile_requests_are_answered_and_the_appliance_keeps_serving(
    served: tuple[str, Appliance],
) -> None:
    base, appliance = served
    api = f"http://127.0.0.1:{appliance.ports['management']}"
    multipart = {"Content-Type": "multipart/form-data"}  # no boundary
    cases = [
        ("POST", f"{base}/predictions/echo", {"data": b"a", "headers": multipart}, 400),
        ("POST", f"{base}/predictions/echo/{'9' * 5000}", {"data": b"x"}, 404),
        ("GET", f"{api}/models?limit=abc", {}, 400),
        ("POST", f"{api}/models?url=../../../etc/passwd", {}, 404),
        ("POST", f"{api}/models?url=file:///etc/passwd", {}, 400),
        ("PUT", f"{api}/models/echo?min_worker=2&max_worker=1", {}, 400),
    ]
    for method, url, kwargs, status in cases:
        answer = requests.request(method, url, timeout=TIMEOUT, **kwargs)
        assert answer.status_code == status, (url[-40:], answer.text)
        assert answer.json()["code"] == status
    # Malformed JSON reaches the handler as bytes, as on TorchServe.
    bad = requests.post(
        f"{base}/predictions/echo",
        data=b"{bad json",
        headers={"Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert (bad.status_code, bad.content) == (200, b"{bad json")
    assert appliance.process.poll() is None
    assert requests.get(f"{base}/ping", timeout=TIMEOUT).status_code == 200
