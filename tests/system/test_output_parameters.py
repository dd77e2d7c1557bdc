"""A model's per-output and response parameters (core/output_parameters.py) in KServe
responses.

A model that returns an ``OutputsWithParameters`` has each output's parameters and
the response's rendered by both KServe encoders (REST, with or without binary data,
in a stream's events too; gRPC's maps, which have no place for a list); the other
protocols answer as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.system.harness import Appliance, running

MODELS = [
    {"name": "described", "class": "tests.models:Described"},
    {"name": "described_echo", "class": "tests.models:DescribedEcho"},
]
X = np.array([[1.0, 2.0]], np.float32)
GIVEN = {"content_type": "np", "scale": 2, "exact": True, "ratio": 0.5, "axes": [0, 1]}
SAID = {"content_type": "pd", "rows": 1, "tags": ["a"]}


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(MODELS) as started:
        yield started


def test_rest_json_outputs_carry_the_model_s_parameters(appliance: Appliance) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
    reply = requests.post(
        f"http://127.0.0.1:{appliance.ports['http']}/v2/models/described/infer",
        json={"inputs": [x]},
        timeout=30,
    ).json()
    outputs = {o["name"]: o for o in reply["outputs"]}
    assert outputs["y"]["parameters"] == GIVEN
    assert outputs["y"]["data"] == [2.0, 4.0]
    assert "parameters" not in outputs["n"]
    assert reply["parameters"] == SAID


def test_an_output_handed_back_without_a_copy_keeps_them(appliance: Appliance) -> None:
    """A large input's view, returned as an output, is the worker's pass-through: its
    parameters and the other outputs' still reach the client."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        data = np.arange(2 * 65536, dtype=np.float32).reshape(-1, 2)  # 512 KiB, in the ring
        x = httpclient.InferInput("x", list(data.shape), "FP32")
        x.set_data_from_numpy(data)
        result = client.infer("described_echo", [x])
        assert result.get_output("y")["parameters"]["content_type"] == "np"
        assert result.get_output("n")["parameters"]["rows"] is True
        assert result.get_response()["parameters"] == {"echoed": True}
        assert np.array_equal(result.as_numpy("y"), data)
    finally:
        client.close()


def test_an_infer_stream_event_carries_them_too(appliance: Appliance) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
    reply = requests.post(
        f"http://127.0.0.1:{appliance.ports['http']}/v2/models/described/infer_stream",
        json={"inputs": [x]},
        timeout=30,
    )
    events = [json.loads(line[6:]) for line in reply.text.split("\n") if line.startswith("data: ")]
    assert [event["parameters"] for event in events] == [SAID]


def test_rest_binary_outputs_carry_them_beside_binary_data_size(appliance: Appliance) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        x = httpclient.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(X)
        result = client.infer("described", [x])
        y = result.get_output("y")
        assert y["parameters"] == {**GIVEN, "binary_data_size": 8}
        assert result.get_response()["parameters"] == SAID
        assert result.as_numpy("y").tolist() == [[2.0, 4.0]]
    finally:
        client.close()


def test_grpc_outputs_carry_the_parameters_a_map_can_hold(appliance: Appliance) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        x = grpcclient.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(X)
        result = client.infer("described", [x])
        outputs = {o["name"]: o for o in result.get_response(as_json=True)["outputs"]}
        assert outputs["y"]["parameters"] == {
            "content_type": {"string_param": "np"},
            "scale": {"int64_param": "2"},
            "exact": {"bool_param": True},
            "ratio": {"double_param": 0.5},
        }
        assert "parameters" not in outputs["n"]
        assert result.as_numpy("y").tolist() == [[2.0, 4.0]]
        assert result.get_response(as_json=True)["parameters"] == {
            "content_type": {"string_param": "pd"},
            "rows": {"int64_param": "1"},
        }
    finally:
        client.close()


def test_grps_answers_as_before(appliance: Appliance) -> None:
    tensor = {"name": "x", "dtype": "DT_FLOAT32", "shape": [1, 2], "flat_float32": [1.0, 2.0]}
    reply = requests.post(
        f"http://127.0.0.1:{appliance.ports['http']}/grps/v1/infer/predict",
        json={"model": "described", "gtensors": {"tensors": [tensor]}},
        timeout=30,
    ).json()
    out = {t["name"]: t for t in reply["gtensors"]["tensors"]}
    assert out["y"]["flat_float32"] == [2.0, 4.0]
    assert set(out["y"]) == {"name", "dtype", "shape", "flat_float32"}
