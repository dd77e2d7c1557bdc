"""Models on the GPU: ``device = "cuda"`` for ONNX, TorchScript and Python models.

One appliance serves digits exported to ONNX and TorchScript (copied from
appliance/demos/repository with ``device = "cuda"`` added to their config.toml,
two instances each), the numpy ``digits`` demo on the CPU as the reference
(tests/system/test_runtimes.py shows the three agree on the CPU), and the
same demo with ``device = "cuda"`` in its ``[[models]]`` table. On a host without a usable
GPU the CUDA models fail to load with a message that says so, and the rest
serves; on a GPU host (tests marked ``gpu``) tritonclient drives the CUDA
models over gRPC and REST and their outputs equal the CPU ones.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import umbridge
from graphpipe import remote
from kubemo.client import Client as KubemoClient
from kubemo.serialize import Json

from appliance._generated import grps_pb2, grps_pb2_grpc
from tests.gpu import cuda_missing, onnx_cuda_missing
from tests.system.harness import (
    ROOT,
    Appliance,
    demo_models,
    eventually,
    make_config,
    new_run_dir,
    serving,
)
from tests.system.protocol_load import mip_url

# graphpipe's client calls flatbuffers' deprecated EndVector(n).
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

EXAMPLES = ROOT / "appliance" / "demos" / "repository"
HOLDOUT = ROOT / "tests" / "data" / "digits_holdout.npz"
# model on the GPU -> its copy in appliance/demos/repository
PAIRS = {"digits_onnx_cuda": "digits_onnx", "digits_torch_cuda": "digits_torch"}
# Nine processes import torch or onnxruntime at once on a small machine.
START_TIMEOUT_S = 240.0
ROWS_PER_REQUEST = 60  # max_batch_size is 64
GPU_MODELS = (*PAIRS, "digits_cuda")


@pytest.fixture(scope="module")
def repository() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    for cuda, cpu in PAIRS.items():
        shutil.copytree(EXAMPLES / cpu, root / cuda)
        config = root / cuda / "config.toml"
        text = config.read_text() if config.exists() else ""
        # Top-level keys go before the first table.
        config.write_text(f'device = "cuda"\ninstances = 2\n{text}')
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    run_dir = new_run_dir()
    models = demo_models("simple", "digits")
    models.append({**demo_models("digits")[0], "name": "digits_cuda", "device": "cuda"})
    config = make_config(run_dir, models)
    config["repositories"] = [{"path": str(repository)}]
    config["mip"] = {"listeners": [{"port": 0, "model": name} for name in GPU_MODELS]}
    with serving(config, ready_timeout_s=START_TIMEOUT_S) as started:
        yield started


@pytest.fixture(scope="module")
def pixels() -> npt.NDArray[np.float32]:
    with np.load(HOLDOUT) as data:
        return np.ascontiguousarray(data["X"].astype(np.float32))


def index_of(appliance: Appliance) -> dict[str, dict[str, Any]]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        models = client.get_model_repository_index(as_json=True)["models"]
    finally:
        client.close()
    return {entry["name"]: entry for entry in models}


def test_cuda_models_fail_to_load_without_a_gpu_and_the_rest_serves(
    appliance: Appliance,
) -> None:
    if not cuda_missing():
        pytest.skip("a CUDA device is usable here; the CUDA models load")
    # The tree counts as started once one instance of each model failed; the
    # second instance of a two-instance model may still be loading. The master
    # retries a failed load after a pause; a slot it restarts shows the last
    # note but no device until the new process resolves it. So each model's
    # instance is read from the first listing that shows it with both (a
    # listing where every failing instance has both at once can take a minute).
    failing = ("digits_cuda", *PAIRS)
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + START_TIMEOUT_S
    while not all(model in seen for model in (*failing, "digits")):
        assert time.monotonic() < deadline, (seen, appliance.processes())
        for process in appliance.processes():
            model = process["model"]
            told = process.get("note") or model not in failing
            if model and model not in seen and process.get("device") and told:
                seen[model] = process
        time.sleep(0.05)
    notes = {model: p.get("note", "") for model, p in seen.items()}
    devices = {model: p.get("device") for model, p in seen.items()}
    # Without torch at all (an install without the torch extra) the reasons say so.
    if "torch is not installed" in cuda_missing():
        assert "device cuda:0 requested but torch is not installed" in notes["digits_cuda"]
        assert "needs torch, which is not installed" in notes["digits_torch_cuda"]
    else:
        assert "device cuda:0 requested but no GPU is usable" in notes["digits_cuda"]
        assert "torch.cuda.is_available() is False" in notes["digits_cuda"]
        assert "torch.cuda.is_available() is False" in notes["digits_torch_cuda"]
    if "not installed" in onnx_cuda_missing():
        assert "needs onnxruntime, which is not installed" in notes["digits_onnx_cuda"]
    elif onnx_cuda_missing():
        assert "has no CUDAExecutionProvider" in notes["digits_onnx_cuda"]
        assert "onnxruntime-gpu" in notes["digits_onnx_cuda"]
    assert devices["digits"] == "cpu"
    assert devices["digits_cuda"] == "cuda:0"  # the failed instance says where it tried
    index = index_of(appliance)
    for model in ("digits_cuda", *PAIRS):
        assert index[model]["state"] == "UNAVAILABLE", model
        reason = index[model]["reason"]
        assert "requested but" in reason or "which is not installed" in reason, model
    for model in ("simple", "digits"):
        assert index[model]["state"] == "READY", model
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        tensor = grpcclient.InferInput("pixels", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 64), np.float32))
        assert client.infer("digits", [tensor]).as_numpy("probabilities").shape == (1, 10)
    finally:
        client.close()


def infer_grpc(
    client: grpcclient.InferenceServerClient, model: str, rows: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    tensor = grpcclient.InferInput("pixels", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    result: npt.NDArray[np.float32] = client.infer(model, [tensor]).as_numpy("probabilities")
    return result


def infer_rest(
    client: httpclient.InferenceServerClient, model: str, rows: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    tensor = httpclient.InferInput("pixels", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=True)
    result: npt.NDArray[np.float32] = client.infer(model, [tensor]).as_numpy("probabilities")
    return result


def gpu_ready(appliance: Appliance, model: str) -> None:
    if model.startswith("digits_onnx") and onnx_cuda_missing():
        pytest.skip(onnx_cuda_missing())
    index = index_of(appliance)
    assert index[model]["state"] == "READY", index[model].get("reason")


@pytest.mark.gpu
@pytest.mark.parametrize("model", GPU_MODELS)
def test_gpu_outputs_equal_the_cpu_ones_over_grpc_and_rest(
    appliance: Appliance, pixels: npt.NDArray[np.float32], model: str
) -> None:
    gpu_ready(appliance, model)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        for start_row in range(0, len(pixels), ROWS_PER_REQUEST):
            rows = pixels[start_row : start_row + ROWS_PER_REQUEST]
            want = infer_grpc(grpc, "digits", rows)
            for got in (infer_grpc(grpc, model, rows), infer_rest(rest, model, rows)):
                assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1)), model
                # GPU kernels sum in another order than the CPU's.
                assert np.abs(got - want).max() < 1e-4, model
    finally:
        grpc.close()
        rest.close()


@pytest.mark.gpu
def test_gpu_instances_report_their_device(appliance: Appliance) -> None:
    # The ONNX pair needs onnxruntime-gpu; the TorchScript pair reports without it.
    served = [m for m in PAIRS if not (m.startswith("digits_onnx") and onnx_cuda_missing())]
    for model in served:
        gpu_ready(appliance, model)
    rows = [p for p in appliance.processes() if p["model"] in served]
    assert len(rows) == 2 * len(served)  # two instances each
    for row in rows:
        assert row["device"].startswith("cuda:"), row
    # instance i goes to GPU i mod count: two GPUs or more spread them.
    devices = {row["device"] for row in rows if row["model"] == "digits_torch_cuda"}
    assert len(devices) == min(2, int(__import__("torch").cuda.device_count()))

    def memory_published() -> bool:
        rows = [p for p in appliance.processes() if p["model"] == "digits_torch_cuda"]
        return all((row["device_memory_bytes"] or 0) > 0 for row in rows)

    # Workers publish it at housekeeping, every few seconds.
    assert eventually(memory_published, 30.0), appliance.processes()
    metrics = requests.get(f"http://127.0.0.1:{appliance.ports['http']}/metrics", timeout=10).text
    assert "appliance_model_device_memory_bytes{" in metrics


def over_other_protocols(
    appliance: Appliance, model: str, rows: npt.NDArray[np.float32]
) -> dict[str, npt.NDArray[np.float32]]:
    """Return ``model``'s probabilities for ``rows`` from each protocol's stock client."""
    http = f"http://127.0.0.1:{appliance.ports['http']}"
    got = {}
    reply = requests.post(
        f"{http}/grps/v1/infer/predict?return-ndarray=true",
        json={"model": model, "ndarray": rows.tolist()},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    got["grps-rest"] = np.asarray(reply.json()["ndarray"], np.float32)
    with grpc.insecure_channel(f"127.0.0.1:{appliance.ports['grpc']}") as channel:
        request = grps_pb2.GrpsMessage(model=model)
        request.gtensors.tensors.add(
            name="pixels", dtype=grps_pb2.DT_FLOAT32, shape=rows.shape, flat_float32=rows.ravel()
        )
        answer = grps_pb2_grpc.GrpsServiceStub(channel).Predict(request, timeout=30)
    assert answer.status.code == 200, answer.status.msg
    [tensor] = answer.gtensors.tensors
    got["grps-grpc"] = np.asarray(tensor.flat_float32, np.float32).reshape(tuple(tensor.shape))
    got["graphpipe"] = np.asarray(remote.execute(f"{http}/graphpipe/{model}", rows))
    bridge = umbridge.HTTPModel(http, model)
    got["umbridge"] = np.array([bridge([row.tolist()])[0] for row in rows], np.float32)
    # PROTOCOL-FACTS §4.3: the stock Json(obj) is broken; Json over bytes works.
    # One item per row: the worker batches them.
    items = tuple((Json(io.BytesIO(json.dumps(row.tolist()).encode())),) for row in rows)
    answers = KubemoClient().inference(mip_url(appliance, model), items)
    got["mip"] = np.array([answer.decode() for [answer] in answers], np.float32)
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("model", GPU_MODELS)
def test_gpu_models_answer_over_every_other_protocol(
    appliance: Appliance, pixels: npt.NDArray[np.float32], model: str
) -> None:
    gpu_ready(appliance, model)
    rows = pixels[:3]
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        want = infer_grpc(grpc_client, "digits", rows)
    finally:
        grpc_client.close()
    for protocol, got in over_other_protocols(appliance, model, rows).items():
        assert got.shape == want.shape, protocol
        assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1)), protocol
        assert np.abs(got - want).max() < 1e-4, protocol
