"""A Triton model repository as it is: config.pbtxt files and model files, nothing else.

The appliance's config names the repository only. Its models are digits
exported to ONNX and to TorchScript, each described by a config.pbtxt as
Triton's documentation writes them, an ensemble of one of them, served with
no worker of its own, and an ensemble that names a model nowhere served,
which says so. tritonclient drives them over gRPC and REST.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.system.harness import ROOT, Appliance, make_config, new_run_dir, serving

EXAMPLES = ROOT / "appliance" / "demos" / "repository"
HOLDOUT = ROOT / "tests" / "data" / "digits_holdout.npz"
CLASSIFIER = """
name: "{name}"
{runtime}
max_batch_size: 64
input [
  {{
    name: "pixels"
    data_type: TYPE_FP32
    dims: [ 64 ]
  }}
]
output [
  {{
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }}
]
instance_group [ {{ count: 2, kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
model_warmup [ {{
  name: "zeros" batch_size: 2
  inputs {{ key: "pixels" value: {{ data_type: TYPE_FP32 dims: [ 64 ] zero_data: true }} }}
}} ]
"""
ENSEMBLE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 64
input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "digits_onnx"
      model_version: -1
      input_map { key: "pixels" value: "pixels" }
      output_map { key: "probabilities" value: "probabilities" }
    }
  ]
}
"""
UNSERVABLE = ENSEMBLE.replace('"pipeline"', '"dangling"').replace('"digits_onnx"', '"digits_tf"')
MODELS = {"digits_onnx": ('backend: "onnxruntime"', "model.onnx", "digits_onnx")}
MODELS["digits_torch"] = ('platform: "pytorch_libtorch"', "model.pt", "digits_torch")


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    root = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    for name, (runtime, file_name, source) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        shutil.copy(EXAMPLES / source / "1" / file_name, root / name / "1" / file_name)
        (root / name / "config.pbtxt").write_text(CLASSIFIER.format(name=name, runtime=runtime))
    for name, text in (("pipeline", ENSEMBLE), ("dangling", UNSERVABLE)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
    config = make_config(new_run_dir(), [])
    config["repositories"] = [{"path": str(root)}]
    try:
        with serving(config) as started:
            yield started
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def holdout() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    with np.load(HOLDOUT) as data:
        return data["X"][:60].astype(np.float32), data["y"][:60].astype(np.int64)


@pytest.mark.parametrize("model", list(MODELS))
def test_a_model_described_by_config_pbtxt_serves_as_triton_would(
    appliance: Appliance,
    holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]],
    model: str,
) -> None:
    pixels, labels = holdout
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        answers = []
        for module, client in ((grpcclient, grpc), (httpclient, rest)):
            tensor = module.InferInput("pixels", list(pixels.shape), "FP32")
            tensor.set_data_from_numpy(pixels)
            answers.append(client.infer(model, [tensor]).as_numpy("probabilities"))
        config = rest.get_model_config(model)
        metadata = grpc.get_model_metadata(model, as_json=True)
    finally:
        grpc.close()
        rest.close()
    assert np.array_equal(answers[0], answers[1])
    assert (answers[0].argmax(axis=1) == labels).mean() > 0.9
    assert config["max_batch_size"] == 64
    assert config["backend"] == {"onnxruntime_onnx": "onnxruntime"}.get(
        config["platform"], "pytorch"
    )
    assert config["instance_group"][0]["count"] == 2
    assert metadata["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": ["-1", "64"]}]
    instances = [p for p in appliance.processes() if p["role"].startswith(f"model[{model}#")]
    assert len(instances) == 2
    # Each instance ran the warmup sample before it was ready.
    assert appliance.log().count(f"model[{model}#") >= 2
    assert "warmed up: 1 run(s) of 1 sample(s)" in appliance.log()


def test_an_ensemble_serves_with_no_worker_of_its_own(
    appliance: Appliance, holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]
) -> None:
    pixels, _labels = holdout
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        answers = []
        for model in ("pipeline", "digits_onnx"):
            tensor = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
            tensor.set_data_from_numpy(pixels)
            answers.append(rest.infer(model, [tensor]).as_numpy("probabilities"))
        config = rest.get_model_config("pipeline")
        metadata = rest.get_model_metadata("pipeline")
    finally:
        rest.close()
    assert np.array_equal(answers[0], answers[1])
    assert config["platform"] == "ensemble"
    assert config["ensemble_scheduling"]["step"][0]["model_name"] == "digits_onnx"
    assert metadata["platform"] == "ensemble"
    assert metadata["versions"] == ["1"]
    assert not [p for p in appliance.processes() if "pipeline" in p["role"]]


def test_what_cannot_be_served_says_which_field(appliance: Appliance) -> None:
    ready, entry = appliance.kserve_state("dangling")
    assert not ready
    assert entry["state"] == "UNAVAILABLE"
    assert "steps[0].model: no model 'digits_tf' is served" in entry["reason"]
