"""An MLServer model folder served by the appliance (the mlserver extra; skipped without it).

Small on purpose (a worker imports MLServer, seconds of CPU): one custom
``MLModel`` from a models.py, over REST and gRPC. MLServer's own runtimes
(scikit-learn, XGBoost, LightGBM) are compared with MLServer itself in
tests/peers/test_mlserver_oracle.py. The comparison
with MLServer itself, call by call, is tests/peers/test_mlserver_oracle.py.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.mlserver_models import write_folder
from tests.system.harness import Appliance, serving_repository

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mlserver") is None,
    reason="the mlserver extra is not installed (pip install 'appliance[mlserver]')",
)
KEEP = ("custom", "custom-declared", "words")


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    root = tmp_path_factory.mktemp("mlserver")
    for name in write_folder(root, only=("custom",)):
        if name not in KEEP:
            shutil.rmtree(root / name)
    with serving_repository(root) as started:
        yield started


def test_a_custom_model_answers_over_rest_and_its_errors_keep_mlserver_s_message(
    appliance: Appliance,
) -> None:
    base = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/custom"
    words = {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ab", "cd"]}
    reply = requests.post(f"{base}/infer", json={"inputs": [words]}, timeout=30).json()
    # Each output's parameters are the runtime's (StringCodec's content type), as MLServer's.
    assert reply["outputs"] == [
        {
            "name": "upper",
            "datatype": "BYTES",
            "shape": [2, 1],
            "parameters": {"content_type": "str"},
            "data": ["AB", "CD"],
        }
    ]
    words["data"] = ["ab", "boom"]
    refused = requests.post(f"{base}/infer", json={"inputs": [words]}, timeout=30)
    assert (refused.status_code, refused.json()) == (
        400,
        {"error": "model custom: mlserver.errors.InferenceError: the word boom is not served"},
    )


def test_a_custom_model_answers_over_grpc(appliance: Appliance) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        text = grpcclient.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array([b"ab", b"cd"], dtype=object))
        x = grpcclient.InferInput("x", [2], "FP32")
        x.set_data_from_numpy(np.array([1.0, 2.5], np.float32))
        result = client.infer("custom", [text, x])
        assert result.as_numpy("upper").reshape(-1).tolist() == [b"AB", b"CD"]
        assert result.as_numpy("scaled").reshape(-1).tolist() == [2.0, 5.0]
        crash = grpcclient.InferInput("crash", [1], "FP32")
        crash.set_data_from_numpy(np.ones(1, np.float32))
        with pytest.raises(InferenceServerException) as raised:
            client.infer("custom", [crash])
        assert raised.value.status() == "StatusCode.INTERNAL"
        assert "custom model crashed on purpose" in str(raised.value.message())
        # The instance still serves after its model raised.
        assert client.infer("custom", [x]).as_numpy("scaled").reshape(-1).tolist() == [2.0, 5.0]
    finally:
        client.close()


def test_the_folder_is_found_as_mlserver_finds_it(appliance: Appliance) -> None:
    index = requests.post(
        f"http://127.0.0.1:{appliance.ports['http']}/v2/repository/index", json={}, timeout=30
    ).json()
    states = {entry["name"]: entry["state"] for entry in index}
    assert states == {"custom": "READY", "custom-declared": "READY", "words": "READY"}


def test_metadata_lists_the_settings_tensors_and_requests_are_not_checked_against_them(
    appliance: Appliance,
) -> None:
    base = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/custom-declared"
    found = requests.get(base, timeout=30).json()
    assert found["inputs"][0] == {
        "name": "text",
        "datatype": "BYTES",
        "shape": [-1],
        "parameters": {"content_type": "str"},
    }
    assert [o["name"] for o in found["outputs"]] == ["upper", "scaled"]
    assert found["parameters"] == {"content_type": "np"}
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        listed = client.get_model_metadata("custom-declared")
        assert [(t.name, t.datatype, list(t.shape)) for t in listed.inputs] == [
            ("text", "BYTES", [-1]),
            ("x", "FP32", [-1, 2]),
        ]
        # x is declared [-1, 2]; MLServer takes any shape, and so does the appliance.
        x = grpcclient.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(np.arange(3, dtype=np.float32))
        result = client.infer("custom-declared", [x])
        assert result.as_numpy("scaled").reshape(-1).tolist() == [0.0, 1.0, 2.0]
    finally:
        client.close()


def test_predict_stream_answers_a_grpc_stream_with_a_response_per_part(
    appliance: Appliance,
) -> None:
    got: list[Any] = []
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        client.start_stream(callback=lambda result, error: got.append(error or result))
        words = grpcclient.InferInput("text", [1], "BYTES")
        words.set_data_from_numpy(np.array([b"one two"], dtype=object))
        client.async_stream_infer("words", [words])
        client.stop_stream()  # waits for the stream's last response
        assert [r.as_numpy("word").reshape(-1).tolist() for r in got] == [[b"one"], [b"two"]]
        response = got[0].get_response(as_json=True)
        assert response["outputs"][0]["parameters"] == {"content_type": {"string_param": "str"}}
        # Its predict still answers a single inference.
        single = client.infer("words", [words]).as_numpy("word").reshape(-1).tolist()
        assert single == [b"one", b"two"]
    finally:
        client.close()


def test_predict_stream_answers_rest_infer_stream_with_an_event_per_part(
    appliance: Appliance,
) -> None:
    url = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/words/infer_stream"

    def events(text: str) -> list[dict[str, Any]]:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
        answer = requests.post(url, json=body, timeout=30)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = answer.text.split("\n")
        return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]

    got = events("one two")
    assert [e["outputs"][0]["data"] for e in got] == [["one"], ["two"]]
    assert [e["outputs"][1]["data"] for e in got] == [[3], [3]]
    assert got[0]["outputs"][0]["parameters"] == {"content_type": "str"}
    # An error after the first part ends the stream with an event that says it.
    failed = events("one boom")
    assert failed[0]["outputs"][0]["data"] == ["one"]
    assert "the word boom is not streamed" in failed[-1]["error"]
