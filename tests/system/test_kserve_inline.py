"""A model shipped inline in a load request (Triton's ``file:`` parameters), REST and gRPC.

The stock tritonclient sends ``load_model(name, config=..., files=...)``:
over gRPC each file is a ``bytes_param``, over REST a base64 string. The
appliance serves the model from those files under ``name`` (replacing a
configured model of that name) until a plain load or an unload, refuses a
path that could leave the model directory before writing anything, and
leaves nothing on disk once the model no longer serves from its files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.processes.control import ControlError, request
from tests.system.harness import ROOT, Appliance, demo_models, running

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (appliance[onnx])")

MODEL_FILE = ROOT / "appliance" / "demos" / "repository" / "digits_onnx" / "1" / "model.onnx"
CONFIG = '{"platform":"onnxruntime_onnx","max_batch_size":"8"}'
BAD_PATHS = ["file:" + "A" * 256, "file:../x", "file:/etc/x", "file:1/../../x", "file:1//x"]
PIXELS = np.random.default_rng(7).uniform(0, 16, (5, 64)).astype(np.float32)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(demo_models("simple", "digits")) as started:
        yield started


@pytest.fixture(autouse=True)
def as_configured(grpc_client: grpcclient.InferenceServerClient) -> Iterator[None]:
    """After each test, serve the config's models again, so a failure stays in its test."""
    yield
    if grpc_client.is_model_ready("inline_digits"):
        grpc_client.unload_model("inline_digits")
    if grpc_client.get_model_metadata("digits").platform != "python":
        grpc_client.load_model("digits")


@pytest.fixture(scope="module")
def expected() -> npt.NDArray[np.float32]:
    """The model file's answer for PIXELS, evaluated here with onnxruntime."""
    session = ort.InferenceSession(str(MODEL_FILE), providers=["CPUExecutionProvider"])
    answer: npt.NDArray[np.float32] = session.run(["probabilities"], {"pixels": PIXELS})[0]
    return answer


Client: TypeAlias = grpcclient.InferenceServerClient | httpclient.InferenceServerClient


def files() -> dict[str, bytes]:
    return {"file:1/model.onnx": MODEL_FILE.read_bytes()}


def shipped(appliance: Appliance) -> list[Path]:
    """Every file or directory under the tree's inline directory."""
    return sorted((appliance.run_dir / appliance.tree / "inline").glob("**/*"))


def failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def classify(client: Client, model: str) -> npt.NDArray[np.float32]:
    module: Any = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    tensor = module.InferInput("pixels", list(PIXELS.shape), "FP32")
    tensor.set_data_from_numpy(PIXELS)
    answer: npt.NDArray[np.float32] = client.infer(model, [tensor]).as_numpy("probabilities")
    return answer


def index_of(client: Client) -> dict[str, dict[str, Any]]:
    if isinstance(client, grpcclient.InferenceServerClient):
        models = client.get_model_repository_index(as_json=True)["models"]
    else:
        models = client.get_model_repository_index()
    return {entry["name"]: entry for entry in models}


def max_batch_size(client: Client, model: str) -> int:
    if isinstance(client, grpcclient.InferenceServerClient):
        return int(client.get_model_config(model).config.max_batch_size)
    return int(client.get_model_config(model)["max_batch_size"])


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_a_model_shipped_inline_serves_until_unloaded(
    transport: str,
    appliance: Appliance,
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
    expected: npt.NDArray[np.float32],
) -> None:
    client: Client = grpc_client if transport == "grpc" else http_client
    assert "inline_digits" not in index_of(client)
    client.load_model("inline_digits", config=CONFIG, files=files())
    assert client.is_model_ready("inline_digits")
    entry = index_of(client)["inline_digits"]
    assert (entry["state"], entry["version"]) == ("READY", "1")
    answer = classify(client, "inline_digits")
    assert np.allclose(answer, expected, atol=1e-6)
    assert np.array_equal(answer.argmax(axis=1), classify(client, "digits").argmax(axis=1))
    assert max_batch_size(client, "inline_digits") == 8
    assert [p.name for p in shipped(appliance) if p.is_file()] == ["model.onnx"]
    client.unload_model("inline_digits")
    assert not client.is_model_ready("inline_digits")
    assert shipped(appliance) == []
    assert "inline_digits" not in index_of(client)
    error = failure(lambda: client.load_model("inline_digits"))
    assert "failed to load" in error.message()
    assert client.is_model_ready("simple")


def test_files_replace_a_configured_model_until_a_plain_load(
    appliance: Appliance,
    grpc_client: grpcclient.InferenceServerClient,
    expected: npt.NDArray[np.float32],
) -> None:
    assert grpc_client.get_model_metadata("digits").platform == "python"
    grpc_client.load_model("digits", config='{"backend":"onnxruntime"}', files=files())
    assert grpc_client.get_model_metadata("digits").platform == "onnxruntime_onnx"
    assert np.allclose(classify(grpc_client, "digits"), expected, atol=1e-6)
    assert len([p for p in shipped(appliance) if p.is_file()]) == 1
    # A second load with files replaces the first directory.
    grpc_client.load_model("digits", config=CONFIG, files=files())
    assert max_batch_size(grpc_client, "digits") == 8
    assert len([p for p in shipped(appliance) if p.is_file()]) == 1
    grpc_client.load_model("digits")
    assert grpc_client.get_model_metadata("digits").platform == "python"
    assert max_batch_size(grpc_client, "digits") == 64
    assert shipped(appliance) == []
    assert np.array_equal(classify(grpc_client, "digits").argmax(axis=1), expected.argmax(axis=1))


@pytest.mark.parametrize("path", BAD_PATHS)
def test_a_path_that_leaves_the_model_directory_is_refused(
    path: str,
    appliance: Appliance,
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    shipment = {path: b"a", **files()}
    # A name too long for the file system fails Triton's repository poll: INTERNAL.
    codes = (
        ("StatusCode.INTERNAL", "500")
        if len(path) > 255
        else ("StatusCode.INVALID_ARGUMENT", "400")
    )
    for client, refused in zip((grpc_client, http_client), codes, strict=True):
        error = failure(partial(client.load_model, "simple", config="{}", files=shipment))
        assert error.status() == refused
        assert "Invalid file path" in error.message()
        assert "failed to poll from model repository" in error.message()
        assert path[5:25] in error.message()
        assert len(error.message()) < 400
        assert shipped(appliance) == []
        assert client.is_server_live()
        assert client.is_model_ready("simple")
    assert grpc_client.get_model_metadata("simple").platform == "python"


def test_files_need_a_config(
    appliance: Appliance,
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    for client, refused in ((grpc_client, "StatusCode.INVALID_ARGUMENT"), (http_client, "400")):
        error = failure(partial(client.load_model, "inline_digits", files=files()))
        assert error.status() == refused
        assert "failed to load 'inline_digits'" in error.message()
        assert "config" in error.message()
    assert shipped(appliance) == []
    assert not grpc_client.is_model_ready("inline_digits")


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ('{"platform":"pytorch_libtorch"}', "platform"),
        ('{"backend":"tensorflow"}', "backend"),
        ('{"input":[]}', "input"),
        ('{"max_batch_size": 8', "not valid JSON"),
    ],
)
def test_a_config_that_does_not_fit_the_files_is_refused(
    config: str, named: str, appliance: Appliance, grpc_client: grpcclient.InferenceServerClient
) -> None:
    error = failure(lambda: grpc_client.load_model("inline_digits", config=config, files=files()))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "failed to load 'inline_digits'" in error.message()
    assert named in error.message()
    assert shipped(appliance) == []


def test_files_that_hold_no_model_are_refused_and_removed(
    appliance: Appliance, grpc_client: grpcclient.InferenceServerClient
) -> None:
    notes = {"file:1/notes.txt": b"no model here"}
    error = failure(lambda: grpc_client.load_model("inline_digits", config="{}", files=notes))
    assert "failed to load 'inline_digits'" in error.message()
    assert "holds no model.onnx or model.pt or model.py" in error.message()
    assert shipped(appliance) == []
    assert not grpc_client.is_model_ready("inline_digits")


def test_the_master_serves_only_directories_of_its_own_tree(
    appliance: Appliance, tmp_path: Path
) -> None:
    (tmp_path / "simple" / "1").mkdir(parents=True)
    (tmp_path / "simple" / "1" / "model.onnx").write_bytes(MODEL_FILE.read_bytes())
    with pytest.raises(ControlError, match="is not a model directory under"):
        request(appliance.control, "load", model="simple", directory=str(tmp_path / "simple"))
    assert (tmp_path / "simple" / "1" / "model.onnx").is_file()
    assert appliance.ctl("status")["reloading"] is None


def test_nothing_shipped_is_left_once_the_appliance_stops() -> None:
    with running(demo_models("simple")) as appliance:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}") as client:
            client.load_model("inline_digits", config=CONFIG, files=files())
            assert client.is_model_ready("inline_digits")
        assert [p.name for p in shipped(appliance) if p.is_file()] == ["model.onnx"]
        tree_dir = appliance.run_dir / appliance.tree
        assert appliance.stop() == 0
        assert not tree_dir.exists()
