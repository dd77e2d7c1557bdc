"""KServe REST's routes beyond ``infer``: ``infer_stream`` (MLServer's: a model's responses as
server-sent events), and ``generate`` / ``generate_stream`` in both their meanings, MLServer's
aliases of those two and Triton's generate extension (flat JSON objects)."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests

from tests.system.harness import Appliance, demo_models, eventually, running

# Each of flood's parts is 32 KiB of UINT8, about 64 KiB as an event's JSON.
FLOOD_PART = 32768


@pytest.fixture(scope="module")
def flood_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flood")


@pytest.fixture(scope="module")
def appliance(flood_dir: Path) -> Iterator[Appliance]:
    flood = {"name": "flood", "class": "tests.models:Flood"}
    flood["options"] = {"dir": str(flood_dir), "size": FLOOD_PART}
    with running([*demo_models("repeat_int32", "identity", "simple_string"), flood]) as started:
        yield started


def post(appliance: Appliance, model: str, route: str, body: Any) -> requests.Response:
    url = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/{model}/{route}"
    return requests.post(url, data=orjson.dumps(body), timeout=30)


def stream(appliance: Appliance, model: str, body: dict[str, Any]) -> requests.Response:
    return post(appliance, model, "infer_stream", body)


def events(response: requests.Response) -> list[dict[str, Any]]:
    """The JSON of each ``data:`` event, as an SSE client reads them."""
    text = response.content.decode()
    return [
        orjson.loads(line.removeprefix("data: "))
        for line in text.split("\n")
        if line.startswith("data: ")
    ]


def repeat(values: list[int], delays: list[int] | None = None) -> dict[str, Any]:
    delays = delays if delays is not None else [0] * len(values)
    return {
        "inputs": [
            {"name": "IN", "datatype": "INT32", "shape": [len(values)], "data": values},
            {"name": "DELAY", "datatype": "UINT32", "shape": [len(delays)], "data": delays},
            {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]},
        ]
    }


def test_a_streaming_model_answers_an_event_per_response(appliance: Appliance) -> None:
    response = stream(appliance, "repeat_int32", {"id": "r1", **repeat([4, 5, 6], [0, 20, 0])})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    got = events(response)
    assert [e["outputs"][0]["data"] for e in got] == [[4], [5], [6]]
    assert [e["outputs"][1]["data"] for e in got] == [[0], [1], [2]]
    assert {(e["model_name"], e["id"]) for e in got} == {("repeat_int32", "r1")}


def test_any_other_model_answers_one_event(appliance: Appliance) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2]}],
        # Asked for in binary, sent in JSON: an event is one line of text.
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    got = events(stream(appliance, "identity", body))
    assert len(got) == 1
    assert got[0]["outputs"][0]["data"] == [1.5, 2.0]


def test_errors_before_the_first_response_are_kserve_errors(appliance: Appliance) -> None:
    missing = stream(appliance, "nonesuch", repeat([1]))
    assert missing.status_code == 404
    assert "nonesuch" in missing.json()["error"]
    refused = stream(appliance, "repeat_int32", repeat([1, 2], [0]))
    assert refused.status_code == 400
    assert "IN and DELAY must have the same shape" in refused.json()["error"]
    # And the server goes on answering.
    assert len(events(stream(appliance, "repeat_int32", repeat([7])))) == 1


def test_a_client_that_stops_reading_pauses_its_stream_and_loses_nothing(
    appliance: Appliance, flood_dir: Path
) -> None:
    count = 300  # about 19 MiB of events, where the socket buffers hold at most about 4
    body = orjson.dumps(
        {"inputs": [{"name": "count", "datatype": "INT32", "shape": [1], "data": [count]}]}
    )
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(30)
    slow.connect(("127.0.0.1", appliance.ports["http"]))
    connection = http.client.HTTPConnection("127.0.0.1", appliance.ports["http"], timeout=30)
    connection.sock = slow
    try:
        connection.request("POST", "/v2/models/flood/infer_stream", body)
        response = connection.getresponse()
        assert response.status == 200
        # It reads no more. The model is held back once the buffers between are full.
        made = flood_dir / "made"

        def held() -> int:
            before = int(made.read_text())
            time.sleep(0.5)
            return before if int(made.read_text()) == before else -1

        assert eventually(lambda: 0 < held() < count // 2, timeout_s=10)
        # Another stream of the same instance goes on meanwhile.
        other = stream(
            appliance,
            "flood",
            orjson.loads(body)
            | {"inputs": [{"name": "count", "datatype": "INT32", "shape": [1], "data": [3]}]},
        )
        assert [e["outputs"][1]["data"] for e in events(other)] == [[0], [1], [2]]
        # Read at last, the stream goes on to its end with every part in order.
        text = response.read().decode()
    finally:
        connection.close()
    got = [orjson.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]
    assert [e["outputs"][1]["data"][0] for e in got] == list(range(count))
    assert all(len(e["outputs"][0]["data"]) == FLOOD_PART for e in got)


# -- generate and generate_stream ---------------------------------------------------


def test_generate_with_an_inference_request_answers_as_infer(appliance: Appliance) -> None:
    """MLServer's generate and generate_stream: aliases of infer and infer_stream."""
    body = {
        "id": "g0",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2]}],
    }
    answer = post(appliance, "identity", "generate", body)
    assert answer.status_code == 200
    assert answer.json() == post(appliance, "identity", "infer", body).json()
    streamed = events(post(appliance, "repeat_int32", "generate_stream", repeat([4, 5])))
    assert [e["outputs"][0]["data"] for e in streamed] == [[4], [5]]


def test_triton_s_generate_maps_the_body_s_keys_to_inputs(appliance: Appliance) -> None:
    answer = post(appliance, "identity", "generate", {"INPUT0": [1.5, 2.5], "id": "g1"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json() == {
        "OUTPUT0": [1.5, 2.5],
        "id": "g1",
        "model_name": "identity",
        "model_version": "1",
    }
    # One value: a scalar back. Strings for BYTES; other keys are parameters.
    assert post(appliance, "identity", "generate", {"INPUT0": 3}).json()["OUTPUT0"] == 3.0
    nested = post(appliance, "identity", "generate", {"INPUT0": [[1], [2]]})
    assert nested.json()["OUTPUT0"] == [1.0, 2.0]
    numbers = [str(n) for n in range(16)]
    body = {"INPUT0": numbers, "parameters": {"INPUT1": ["1"] * 16, "temperature": 0.5}}
    summed = post(appliance, "simple_string", "generate", body).json()
    assert summed["OUTPUT0"] == [str(n + 1) for n in range(16)]
    assert summed["OUTPUT1"] == [str(n - 1) for n in range(16)]


def test_triton_s_generate_stream_sends_an_event_per_response(appliance: Appliance) -> None:
    body = {"IN": [4, 5, 6], "DELAY": [0, 0, 0], "WAIT": 0}
    answer = post(appliance, "repeat_int32", "generate_stream", body)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert [(e["OUT"], e["IDX"]) for e in events(answer)] == [(4, 0), (5, 1), (6, 2)]
    # generate answers one response: a model that gives one is answered, several refused.
    one = post(appliance, "repeat_int32", "generate", {"IN": [7], "DELAY": [0], "WAIT": 0})
    assert (one.status_code, one.json()["OUT"]) == (200, 7)
    several = post(appliance, "repeat_int32", "generate", body)
    assert several.status_code == 400
    assert "generate_stream" in several.json()["error"]


def test_generate_errors_name_what_is_wrong(appliance: Appliance) -> None:
    cases = [
        ("nonesuch", {"text_input": "x"}, 404, "nonesuch"),
        ("simple_string", {"INPUT0": ["1"] * 3, "INPUT1": ["1"] * 16}, 400, "INPUT0"),
        ("simple_string", {"INPUT0": [1] * 16, "INPUT1": ["1"] * 16}, 400, "INPUT0"),
        ("identity", {"INPUT0": [{"a": 1}]}, 400, "a string, a number or a boolean"),
        ("identity", {"INPUT0": [1], "stop": [1, 2]}, 400, "stop"),
        ("identity", {"INPUT0": [1], "parameters": 3}, 400, "parameters"),
        ("identity", [1, 2], 400, "JSON object"),
        ("identity", {"text_input": "x"}, 400, "INPUT0"),
    ]
    for model, body, status, word in cases:
        answer = post(appliance, model, "generate", body)
        assert (answer.status_code, word in answer.json()["error"]) == (status, True), (
            model,
            body,
            answer.text,
        )
    # Nested as deep as a JSON parser allows: refused, not a recursion in the frontend.
    url = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/identity/generate"
    deep = requests.post(url, data='{"INPUT0": ' + "[" * 1000 + "1" + "]" * 1000 + "}", timeout=30)
    assert (deep.status_code, "nested too deeply" in deep.json()["error"]) == (400, True)
    assert post(appliance, "identity", "generate", {"INPUT0": 1}).status_code == 200
