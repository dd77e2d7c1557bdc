"""Fields of Triton's model config the appliance serves: optional inputs and warmup.

One appliance serves a copy of tests/data/triton_config_models (Python-backend
models with config.pbtxt), models whose warmup cannot run, and demo models
warmed up through their options; tritonclient drives it over REST. What real
Triton answers to the same models is compared in
tests/peers/test_triton_config_oracle.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.system.harness import Appliance, demo_models, make_config, new_run_dir, serving
from tests.triton_config_repository import copy_to

RAISES_ON_ZEROS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if not x.any():
            raise ValueError("all zeros")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]) for _ in requests]
"""


def warm_model(root: Path, name: str, sample: str, model_py: str = RAISES_ON_ZEROS) -> None:
    """A Python model whose config.pbtxt has one warmup sample (protobuf text)."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(model_py)
    (root / name / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'
        f"model_warmup [ {{ {sample} }} ]\n"
    )


def sample(name: str, data: str, batch_size: int = 1) -> str:
    source = "zero_data: true" if data == "zero" else f'input_data_file: "{data}"'
    return (
        f'name: "{name}" batch_size: {batch_size} '
        f'inputs {{ key: "X" value: {{ data_type: TYPE_FP32, dims: [ 2 ], {source} }} }}'
    )


def zeros_sample(dtype: str, rows: int, count: int = 1) -> dict[str, object]:
    return {
        "name": "zeros",
        "batch_size": rows,
        "count": count,
        "inputs": [{"name": "INPUT0", "dtype": dtype, "dims": [2], "data": "zero"}],
    }


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    root = tmp_path_factory.mktemp("triton-config")
    copy_to(root)
    warm_model(root, "warm_missing_file", sample("from a file", "nope.bin"))
    warm_model(root, "warm_raises", sample("zeros", "zero"))
    warm_model(root, "warm_too_big", sample("zeros", "zero", batch_size=9))
    models = demo_models(
        "custom_identity_int32",
        "identity",
        custom_identity_int32={"options": {"warmup": [zeros_sample("INT32", 3, count=2)]}},
        identity={"options": {"warmup": [zeros_sample("INT32", 1)]}},
    )
    config = make_config(new_run_dir(), models)
    config["server"]["response_cache_bytes"] = 1 << 20
    config["repositories"] = [{"path": str(root)}]
    with serving(config) as started:
        yield started


@pytest.fixture
def client(appliance: Appliance) -> Iterator[httpclient.InferenceServerClient]:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    yield rest
    rest.close()


def tensor(name: str, array: np.ndarray) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(array.shape), "FP32")
    item.set_data_from_numpy(array)
    return item


def test_an_optional_input_may_be_left_out_and_execute_finds_none(
    client: httpclient.InferenceServerClient,
) -> None:
    a = np.ones((2, 2), np.float32)
    without = client.infer("optional_in", [tensor("A", a)])
    assert without.as_numpy("SUM").tolist() == a.tolist()
    assert without.as_numpy("HAS_B").tolist() == [[False], [False]]
    given = client.infer("optional_in", [tensor("A", a), tensor("B", a * 2)])
    assert given.as_numpy("SUM").tolist() == (a * 3).tolist()
    inputs = client.get_model_config("optional_in")["input"]
    assert [(i["name"], i["optional"]) for i in inputs] == [("A", False), ("B", True)]


def test_a_required_input_is_still_required_beside_an_optional_one(
    client: httpclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("optional_in", [tensor("B", np.ones((1, 2), np.float32))])
    assert caught.value.status() == "400"
    assert "missing input 'A' (it expects A; B optional)" in caught.value.message()


def test_warmup_samples_reach_the_model_before_its_first_request(
    client: httpclient.InferenceServerClient,
) -> None:
    x = np.full((1, 3), 7, np.float32)
    seen = json.loads(client.infer("warm", [tensor("X", x)]).as_numpy("SEEN")[0][0])
    # zeros: 2 runs of 2 requests; noise: 1 of 1 (random); from a file: 1 of 3.
    assert seen == [[1, [3], [0.0] * 3]] * 4 + [[1, [3], None]] + [[1, [3], [1.0, 2.0, 3.0]]] * 3
    # A worker adds its counts to the statistics once idle: wait for this request's.
    deadline = time.monotonic() + 10
    while True:
        statistics = client.get_inference_statistics("warm")["model_stats"][0]
        if statistics["inference_count"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert statistics["inference_count"] == 1, "warmup runs are not counted as requests"


def test_a_native_model_is_warmed_up_through_its_options(appliance: Appliance) -> None:
    ready, _ = appliance.kserve_state("custom_identity_int32")
    assert ready
    assert "warmed up: 2 run(s) of 1 sample(s)" in appliance.log()


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("warm_missing_file", "warm_missing_file/warmup/nope.bin is not there"),
        (
            "warm_raises",
            "warmup sample 'zeros' failed: model warm_raises: execute raised ValueError: all zeros",
        ),
        ("warm_too_big", "batch_size: 9 exceeds max_batch_size 4"),
        (
            "identity",
            "warmup sample 'zeros' failed: model identity input INPUT0: expected datatype "
            "FP32, got INT32",
        ),
    ],
)
def test_a_warmup_that_cannot_run_fails_the_load_and_says_why(
    appliance: Appliance, model: str, words: str
) -> None:
    ready, entry = appliance.kserve_state(model)
    assert not ready
    assert words in entry["reason"], entry
    assert "warm" in [p["model"] for p in appliance.processes() if p["state"] == "ready"]


def runs_of(module: Any, url: str, value: float, **kwargs: Any) -> int:
    """cached's RUNS for X = value: how many requests its execute had seen."""
    client = module.InferenceServerClient(url)
    try:
        x = module.InferInput("X", [1, 2], "FP32")
        x.set_data_from_numpy(np.full((1, 2), value, np.float32))
        return int(client.infer("cached", [x], **kwargs).as_numpy("RUNS")[0][0])
    finally:
        client.close()


def test_a_repeated_request_is_answered_from_the_cache_over_every_transport(
    appliance: Appliance,
) -> None:
    rest = f"127.0.0.1:{appliance.ports['http']}"
    grpc = f"127.0.0.1:{appliance.ports['grpc']}"
    for module, url in ((httpclient, rest), (grpcclient, grpc)):
        # Each frontend process keeps its own cache: its first answer is fresh.
        first = runs_of(module, url, 5.0)
        assert runs_of(module, url, 5.0) == first
    # Other inputs, or other parameters (which a model may read): run anew.
    latest = runs_of(httpclient, rest, 6.0)
    assert runs_of(httpclient, rest, 5.0, parameters={"p": 1}) > latest
    client = httpclient.InferenceServerClient(rest)
    inference = client.get_inference_statistics("cached")["model_stats"][0]["inference_stats"]
    client.close()
    assert inference["cache_hit"]["count"] == 2
    assert inference["cache_hit"]["ns"] > 0
    assert inference["cache_miss"]["count"] == 4


def test_a_reshaped_tensor_is_seen_by_the_model_in_its_own_shape(
    client: httpclient.InferenceServerClient,
) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = client.infer("reshaped", [tensor("IN", x)])
    assert result.as_numpy("SEEN").tolist() == [[2, 2, 2]] * 2
    assert result.as_numpy("OUT").tolist() == (x * 10).reshape(2, 2, 2).tolist()
    metadata = client.get_model_metadata("reshaped")
    assert [t["shape"] for t in metadata["inputs"] + metadata["outputs"]] == [
        [-1, 4],
        [-1, 2, 2],
        [-1, 3],
    ]
