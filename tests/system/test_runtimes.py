"""Models served from a model repository: ONNX Runtime and TorchScript, no Python written.

One appliance serves a copy of appliance/demos/repository (digits exported to ONNX
and TorchScript), a model file that is garbage, a model directory with no
version, and the numpy ``digits`` demo for reference. The stock clients
drive it: tritonclient (KServe gRPC and REST) and umbridge. Like the other
KServe tests, this process never imports the appliance's generated
``kserve_pb2``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import umbridge
from tritonclient.utils import InferenceServerException

from tests.system.harness import ROOT, Appliance, demo_models, make_config, new_run_dir, serving

EXAMPLES = ROOT / "appliance" / "demos" / "repository"
HOLDOUT = ROOT / "tests" / "data" / "digits_holdout.npz"
RUNTIMES = ["digits_onnx", "digits_torch"]
# Requests under max_batch_size (64); larger ones are split (test_large_batches.py).
ROWS_PER_REQUEST = 60


@pytest.fixture(scope="module")
def repository() -> Iterator[Path]:
    # Not under the run_dir: the master sweeps stale directories there.
    root = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    shutil.copytree(EXAMPLES, root, dirs_exist_ok=True)
    (root / "garbage" / "1").mkdir(parents=True)
    (root / "garbage" / "1" / "model.onnx").write_bytes(b"this is no ONNX model")
    (root / "versionless").mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    run_dir = new_run_dir()
    config = make_config(run_dir, demo_models("digits"))
    config["repositories"] = [{"path": str(repository)}]
    with serving(config) as started:
        yield started


@pytest.fixture(scope="module")
def client(grpc_client: grpcclient.InferenceServerClient) -> grpcclient.InferenceServerClient:
    return grpc_client


@pytest.fixture(scope="module")
def holdout() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    with np.load(HOLDOUT) as data:
        return data["X"].astype(np.float32), data["y"].astype(np.int64)


def classify(
    client: grpcclient.InferenceServerClient, model: str, pixels: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    parts = []
    for start_row in range(0, len(pixels), ROWS_PER_REQUEST):
        rows = pixels[start_row : start_row + ROWS_PER_REQUEST]
        tensor = grpcclient.InferInput("pixels", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        result = client.infer(model, [tensor])
        parts.append(result.as_numpy("probabilities"))
    return np.concatenate(parts)


def failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def index_of(client: grpcclient.InferenceServerClient) -> dict[str, dict[str, Any]]:
    models = client.get_model_repository_index(as_json=True)["models"]
    return {entry["name"]: entry for entry in models}


def test_the_interface_comes_from_the_files(client: grpcclient.InferenceServerClient) -> None:
    platforms = {"digits_onnx": "onnxruntime_onnx", "digits_torch": "pytorch_libtorch"}
    for model, platform in platforms.items():
        metadata = client.get_model_metadata(model, as_json=True)
        assert metadata["platform"] == platform
        assert metadata["versions"] == ["1"]
        assert metadata["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": ["-1", "64"]}]
        assert metadata["outputs"] == [
            {"name": "probabilities", "datatype": "FP32", "shape": ["-1", "10"]}
        ]
        config = client.get_model_config(model, as_json=True)["config"]
        assert int(config["max_batch_size"]) == 64


def test_three_runtimes_agree_over_kserve_grpc(
    client: grpcclient.InferenceServerClient,
    holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]],
) -> None:
    pixels, labels = holdout
    reference = classify(client, "digits", pixels)
    assert int((reference.argmax(axis=1) == labels).sum()) == 349  # of 360
    for model in RUNTIMES:
        probabilities = classify(client, model, pixels)
        assert np.array_equal(probabilities.argmax(axis=1), reference.argmax(axis=1)), model
        assert np.abs(probabilities - reference).max() < 1e-5, model


def test_umbridge_evaluates_both_runtimes(
    appliance: Appliance, holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]
) -> None:
    url = f"http://127.0.0.1:{appliance.ports['http']}"
    assert set(RUNTIMES) <= set(umbridge.supported_models(url))
    pixels = holdout[0][:3]
    reference = umbridge.HTTPModel(url, "digits")
    for name in RUNTIMES:
        model = umbridge.HTTPModel(url, name)
        assert (model.get_input_sizes(), model.get_output_sizes()) == ([64], [10])
        for row in pixels:
            got = np.array(model([row.tolist()])[0])
            want = np.array(reference([row.tolist()])[0])
            assert got.argmax() == want.argmax()
            assert np.abs(got - want).max() < 1e-5


def test_a_broken_model_is_reported_and_the_rest_serves(
    appliance: Appliance, client: grpcclient.InferenceServerClient
) -> None:
    notes = {p["model"]: p.get("note", "") for p in appliance.processes() if p["model"]}
    assert "ONNX Runtime cannot load garbage/1/model.onnx: INVALID_PROTOBUF" in notes["garbage"]
    assert "versionless/ has no version directory" in notes["versionless"]
    index = index_of(client)
    for model in ("digits", *RUNTIMES):
        assert index[model]["state"] == "READY"
    assert index["garbage"]["state"] == "UNAVAILABLE"
    assert "INVALID_PROTOBUF" in index["garbage"]["reason"]
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        entry = {e["name"]: e for e in rest.get_model_repository_index()}["versionless"]
        assert "has no version directory" in entry["reason"]
    finally:
        rest.close()
    assert not client.is_model_ready("garbage")
    assert not client.is_server_ready()  # every model must be ready for that
    error = failure(lambda: client.get_model_metadata("garbage"))
    assert "INVALID_PROTOBUF" in error.message()
    tensor = grpcclient.InferInput("pixels", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
    error = failure(lambda: client.infer("garbage", [tensor]))
    assert error.status() == "StatusCode.UNAVAILABLE"
    assert "INVALID_PROTOBUF" in error.message()
    assert client.infer("digits_onnx", [tensor]).as_numpy("probabilities").shape == (1, 10)


class Traffic:
    """A thread classifying one image on each model in a loop, counting failures."""

    def __init__(self, appliance: Appliance, models: list[str]) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
        self.models = models
        self.calls = 0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop)

    def loop(self) -> None:
        tensor = grpcclient.InferInput("pixels", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
        while not self.stop.is_set():
            for model in self.models:
                try:
                    self.client.infer(model, [tensor], client_timeout=30)
                    self.calls += 1
                except InferenceServerException as ex:
                    self.failures.append(f"{model}: {ex.message()}")

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        self.client.close()


def test_load_and_unload_while_serving(
    appliance: Appliance, client: grpcclient.InferenceServerClient, repository: Path
) -> None:
    onnx_file = repository / "digits_onnx" / "1" / "model.onnx"
    with Traffic(appliance, ["digits", "digits_torch"]) as traffic:
        # 1. Unloaded: not found for inference, listed as unloaded.
        client.unload_model("digits_onnx")
        assert not client.is_model_ready("digits_onnx")
        tensor = grpcclient.InferInput("pixels", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
        error = failure(lambda: client.infer("digits_onnx", [tensor]))
        assert error.status() == "StatusCode.NOT_FOUND"
        entry = index_of(client)["digits_onnx"]
        assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", "unloaded")
        # 2. A new version dropped in is what the next load serves.
        (repository / "digits_onnx" / "2").mkdir()
        shutil.copy(onnx_file, repository / "digits_onnx" / "2" / "model.onnx")
        client.load_model("digits_onnx")
        assert client.is_model_ready("digits_onnx")
        assert client.get_model_metadata("digits_onnx", as_json=True)["versions"] == ["2"]
        assert client.infer("digits_onnx", [tensor]).as_numpy("probabilities").shape == (1, 10)
        # 3. A broken new version fails to load; the one serving goes on.
        (repository / "digits_onnx" / "3").mkdir()
        (repository / "digits_onnx" / "3" / "model.onnx").write_bytes(b"half a file")
        error = failure(lambda: client.load_model("digits_onnx"))
        assert "failed to load 'digits_onnx' version 3" in error.message()
        assert client.get_model_metadata("digits_onnx", as_json=True)["versions"] == ["2"]
        shutil.rmtree(repository / "digits_onnx" / "3")
        # 4. A model dropped into the repository after the start is loadable.
        shutil.copytree(repository / "digits_torch", repository / "digits_torch_copy")
        assert index_of(client)["digits_torch_copy"]["reason"] == "unloaded"
        client.load_model("digits_torch_copy")
        assert client.is_model_ready("digits_torch_copy")
        error = failure(lambda: client.load_model("no_such_model"))
        assert "failed to load 'no_such_model'" in error.message()
    assert traffic.failures == []
    assert traffic.calls > 0
    appliance.remember_pids()


def test_older_versions_answer_under_the_models_name(holdout: Any) -> None:
    # Two versions of one ONNX model, both served (versions = "all"): Triton
    # clients reach the older one as version 1 of the model, not by its
    # served name digits_onnx.v1.
    root = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    run_dir = new_run_dir()
    try:
        for version in ("1", "2"):
            (root / "digits_onnx" / version).mkdir(parents=True)
            shutil.copy(
                EXAMPLES / "digits_onnx" / "1" / "model.onnx",
                root / "digits_onnx" / version / "model.onnx",
            )
        config = make_config(run_dir, [])
        config["repositories"] = [{"path": str(root), "versions": "all"}]
        with serving(config) as served:
            grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
            rest = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}")
            try:
                metadata = rest.get_model_metadata("digits_onnx")
                assert metadata["versions"] == ["1", "2"]
                assert grpc_client.is_model_ready("digits_onnx", "1")
                assert rest.is_model_ready("digits_onnx", "2")
                pixels = holdout[0][:3]
                want = classify(grpc_client, "digits_onnx", pixels)
                tensor = grpcclient.InferInput("pixels", list(pixels.shape), "FP32")
                tensor.set_data_from_numpy(pixels)
                old = grpc_client.infer("digits_onnx", [tensor], model_version="1")
                assert old.get_response().model_version == "1"
                np.testing.assert_allclose(old.as_numpy("probabilities"), want, rtol=1e-6)
                rest_tensor = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
                rest_tensor.set_data_from_numpy(pixels)
                via_rest = rest.infer("digits_onnx", [rest_tensor], model_version="1")
                np.testing.assert_allclose(via_rest.as_numpy("probabilities"), want, rtol=1e-6)
                error = failure(
                    lambda: grpc_client.infer("digits_onnx", [tensor], model_version="7")
                )
                assert error.status() == "StatusCode.NOT_FOUND"
                assert "version 7 is not found; it has version(s) 1, 2" in error.message()
            finally:
                grpc_client.close()
                rest.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
