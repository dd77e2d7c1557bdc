"""KServe REST ``infer_stream`` (MLServer's route): a model's responses as server-sent events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import requests

from tests.system.harness import Appliance, demo_models, running


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(demo_models("repeat_int32", "identity")) as started:
        yield started


def stream(appliance: Appliance, model: str, body: dict[str, Any]) -> requests.Response:
    url = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/{model}/infer_stream"
    return requests.post(url, data=orjson.dumps(body), stream=True, timeout=30)


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
