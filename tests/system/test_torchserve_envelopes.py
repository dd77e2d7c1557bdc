"""TorchServe's request envelopes (``service_envelope``): KServe v1's and v2's formats
around an unmodified handler, as a KServe user of TorchServe configures them.

With ``kservev2`` the handler gets the request's inputs and its answers become
outputs: over TorchServe's /predictions as v2 JSON, and over the appliance's
own KServe v2 endpoints as tensors (any KServe client). With ``kserve`` it
gets KServe v1's ``instances`` and answers ``{"predictions": [...]}``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.system.harness import Appliance
from tests.system.model_store import serving_model_store
from tests.torchserve_models import write_mar

TIMEOUT = 30
# Doubles every number of each input (v2) or instance (v1); upper-cases text.
HANDLER = """
def _flat(value):
    if isinstance(value, list):
        return [x for item in value for x in _flat(item)]
    return [value]


def handle(data, context):
    if data is None:
        return None
    out = []
    for item in data:
        value = item["data"] if isinstance(item, dict) and "datatype" in item else item
        if isinstance(value, str):
            out.append([value.upper()])
        else:
            out.append([2 * x for x in _flat(value)])
    return out
"""


@contextlib.contextmanager
def _serving(store: Path, envelope: str) -> Iterator[Appliance]:
    write_mar(store, "doubler", HANDLER, version="2.5")
    with serving_model_store(store, flags=("--service-envelope", envelope)) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def v2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    with _serving(tmp_path_factory.mktemp("store"), "kservev2") as appliance:
        yield appliance


def test_kserve_v2_tensors_reach_the_handler_through_its_envelope(v2: Appliance) -> None:
    appliance = v2
    client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        x = httpclient.InferInput("x", [2, 2], "FP32")
        x.set_data_from_numpy(np.array([[1, 2], [3, 4]], dtype=np.float32))
        result = client.infer("doubler", [x])
        # Named after the input, flattened, as TorchServe's envelope answers.
        assert result.as_numpy("x").tolist() == [2.0, 4.0, 6.0, 8.0]
    finally:
        client.close()


def test_a_v2_json_body_on_predictions_is_answered_in_v2_json(v2: Appliance) -> None:
    appliance = v2
    body = {
        "id": "req-7",
        "inputs": [
            {"name": "a", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]},
            {"name": "t", "shape": [1], "datatype": "BYTES", "data": ["abc"]},
        ],
    }
    url = f"http://127.0.0.1:{appliance.ports['http']}/predictions/doubler"
    answer = requests.post(url, json=body, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.content) == {
        "id": "req-7",
        "model_name": "doubler",
        "model_version": "2.5",
        "outputs": [
            {"name": "a", "datatype": "INT64", "data": [2, 4, 6], "shape": [3]},
            {"name": "t", "datatype": "BYTES", "data": ["ABC"], "shape": [1]},
        ],
    }


def test_kserve_v1_instances_are_answered_as_predictions(tmp_path: Path) -> None:
    with _serving(tmp_path / "store", "kserve") as appliance:
        _v1_calls(f"http://127.0.0.1:{appliance.ports['http']}")


def _v1_calls(base: str) -> None:
    answer = requests.post(
        f"{base}/v1/models/doubler:predict", json={"instances": [[1, 2], [3, 4]]}, timeout=30
    )
    assert (answer.status_code, json.loads(answer.content)) == (
        200,
        {"predictions": [[2, 4], [6, 8]]},
    )
    explained = requests.post(
        f"{base}/v1/models/doubler:explain", json={"instances": [[5]]}, timeout=TIMEOUT
    )
    assert json.loads(explained.content) == {"explanations": [[10]]}


def test_an_envelope_torchserve_does_not_have_is_refused_by_name(tmp_path: Path) -> None:
    from appliance.formats import command_line

    config = command_line.config(
        ["--model-store", str(tmp_path), "--service-envelope", "seldon", "--disable-token-auth"]
    )
    assert config["repositories"][0]["envelope"] == "seldon"
    from appliance.config.reader import from_dict
    from appliance.config.settings import ConfigError

    with pytest.raises(ConfigError, match="envelope: expected one of"):
        from_dict(config, str(tmp_path / "config.toml"))
