"""KServe's CUDA shared memory, driven by tritonclient's own helpers on a GPU host.

The client allocates device buffers with ``tritonclient.utils.cuda_shared_memory``
(cuda-python underneath), registers their IPC handles over gRPC or REST, and
names them in requests. The model worker that serves a request opens them:
a model on that GPU reads its inputs in place and its outputs are copied
device to device into the client's buffer; a model on the CPU gets host
copies made by its worker. No frontend process ever holds the GPU. One
appliance serves digits as TorchScript and (where ONNX Runtime has CUDA)
as ONNX on the GPU, the numpy ``digits`` on the CPU, also the reference,
and ``simple`` for Triton's own CUDA-shm example clients. Without a usable
GPU, or without cuda-python for the client's helpers, every test here skips
(the CPU-only answers are in test_kserve_rest.py and test_kserve_grpc.py).
"""

from __future__ import annotations

import base64
import importlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as sysshm
from tritonclient.utils import InferenceServerException

from tests.gpu import cuda_missing, cudashm_missing, gpu_processes, onnx_cuda_missing
from tests.system import triton_examples
from tests.system.harness import ROOT, Appliance, demo_models, make_config, new_run_dir, serving

pytestmark = pytest.mark.gpu

EXAMPLES = ROOT / "appliance" / "demos" / "repository"
HOLDOUT = ROOT / "tests" / "data" / "digits_holdout.npz"
MODEL = "digits_torch_cuda"
ONNX_MODEL = "digits_onnx_cuda"
ROWS = 60
PIXELS = ROWS * 64 * 4
PROBABILITIES = ROWS * 10 * 4
CLIENTS = {"grpc": grpcclient, "http": httpclient}
KEY = "/cuda_shm_test_system"


@pytest.fixture(scope="module")
def cudashm() -> ModuleType:
    missing = cuda_missing() or cudashm_missing()
    if missing:
        pytest.skip(missing)
    module: ModuleType = importlib.import_module("tritonclient.utils.cuda_shared_memory")
    return module


@pytest.fixture(scope="module")
def appliance(cudashm: ModuleType) -> Iterator[Appliance]:
    repository = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    on_gpu = {MODEL: "digits_torch"}
    if not onnx_cuda_missing():
        on_gpu[ONNX_MODEL] = "digits_onnx"
    for name, source in on_gpu.items():
        shutil.copytree(EXAMPLES / source, repository / name)
        config_file = repository / name / "config.toml"
        text = config_file.read_text() if config_file.exists() else ""
        config_file.write_text(f'device = "cuda"\n{text}')
    config = make_config(new_run_dir(), demo_models("simple", "digits"))
    config["repositories"] = [{"path": str(repository)}]
    try:
        with serving(config, ready_timeout_s=240.0) as started:
            yield started
    finally:
        shutil.rmtree(repository, ignore_errors=True)


@pytest.fixture(scope="module")
def pixels() -> npt.NDArray[np.float32]:
    with np.load(HOLDOUT) as data:
        return np.ascontiguousarray(data["X"][:ROWS].astype(np.float32))


def connect(appliance: Appliance, transport: str) -> Any:
    return CLIENTS[transport].InferenceServerClient(f"127.0.0.1:{appliance.ports[transport]}")


def failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


class Regions:
    """Device buffers made with tritonclient's helpers; destroyed at the end."""

    def __init__(self, cudashm: ModuleType) -> None:
        self.cudashm = cudashm
        self.made: list[Any] = []

    def make(self, name: str, byte_size: int) -> Any:
        handle = self.cudashm.create_shared_memory_region(name, byte_size, 0)
        self.made.append(handle)
        return handle

    def destroy(self) -> None:
        for handle in self.made:
            self.cudashm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(cudashm: ModuleType) -> Iterator[Regions]:
    made = Regions(cudashm)
    yield made
    made.destroy()


def infer_in_cuda(client: Any, transport: str, model: str, rows: int) -> Any:
    """Infer ``model`` with pixels from region "pixels" and probabilities into "probs"."""
    module = CLIENTS[transport]
    tensor = module.InferInput("pixels", [rows, 64], "FP32")
    tensor.set_shared_memory("pixels", rows * 64 * 4)
    wanted = module.InferRequestedOutput("probabilities")
    wanted.set_shared_memory("probs", rows * 10 * 4)
    return client.infer(model, [tensor], outputs=[wanted])


def register(
    client: Any, cudashm: ModuleType, inputs: Any, outputs: Any, probs_bytes: int = PROBABILITIES
) -> None:
    """Register the "pixels" and "probs" regions (none other stays registered)."""
    client.unregister_cuda_shared_memory()
    client.register_cuda_shared_memory("pixels", cudashm.get_raw_handle(inputs), 0, PIXELS)
    client.register_cuda_shared_memory("probs", cudashm.get_raw_handle(outputs), 0, probs_bytes)


def reference(appliance: Appliance, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    client = connect(appliance, "grpc")
    try:
        tensor = grpcclient.InferInput("pixels", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        result: npt.NDArray[np.float32] = client.infer("digits", [tensor]).as_numpy("probabilities")
        return result
    finally:
        client.close()


@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.parametrize("model", [MODEL, ONNX_MODEL, "digits"])
def test_a_model_reads_inputs_from_and_writes_outputs_to_cuda_shared_memory(
    appliance: Appliance,
    cudashm: ModuleType,
    regions: Regions,
    pixels: npt.NDArray[np.float32],
    transport: str,
    model: str,
) -> None:
    """On the GPU in place (TorchScript, ONNX Runtime's IOBinding); on the CPU by its worker."""
    if model == ONNX_MODEL and onnx_cuda_missing():
        pytest.skip(onnx_cuda_missing())
    inputs, outputs = regions.make("pixels", PIXELS), regions.make("probs", PROBABILITIES)
    cudashm.set_shared_memory_region(inputs, [pixels])
    client = connect(appliance, transport)
    try:
        register(client, cudashm, inputs, outputs)
        status = client.get_cuda_shared_memory_status()
        result = infer_in_cuda(client, transport, model, ROWS)
        client.unregister_cuda_shared_memory()
        after = client.get_cuda_shared_memory_status()
    finally:
        client.close()
    if transport == "grpc":
        listed = {name: (r.device_id, r.byte_size) for name, r in status.regions.items()}
        assert len(after.regions) == 0
    else:
        listed = {r["name"]: (r["device_id"], r["byte_size"]) for r in status}
        assert after == []
    assert listed == {"pixels": (0, PIXELS), "probs": (0, PROBABILITIES)}
    # The reply names the output and carries no data; the data is on the device.
    output = result.get_output("probabilities")
    shape = list(output.shape) if transport == "grpc" else output["shape"]
    assert shape == [ROWS, 10]
    got = cudashm.get_contents_as_numpy(outputs, np.float32, [ROWS, 10])
    want = reference(appliance, pixels)
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    assert np.abs(got - want).max() < 1e-4


def test_a_region_registered_over_rest_serves_grpc_and_shares_names_with_system_regions(
    appliance: Appliance,
    cudashm: ModuleType,
    regions: Regions,
    pixels: npt.NDArray[np.float32],
) -> None:
    inputs, outputs = regions.make("pixels", PIXELS), regions.make("probs", PROBABILITIES)
    cudashm.set_shared_memory_region(inputs, [pixels])
    rest, grpc = connect(appliance, "http"), connect(appliance, "grpc")
    try:
        register(rest, cudashm, inputs, outputs)
        # Another process (the gRPC frontend) opens the handles on first use.
        infer_in_cuda(grpc, "grpc", MODEL, ROWS)
        got = cudashm.get_contents_as_numpy(outputs, np.float32, [ROWS, 10])
        segment = sysshm.create_shared_memory_region("pixels", KEY, 64)
        try:
            taken = failure(lambda: grpc.register_system_shared_memory("pixels", KEY, 64))
        finally:
            sysshm.destroy_shared_memory_region(segment)
        again = failure(
            lambda: grpc.register_cuda_shared_memory(
                "pixels", cudashm.get_raw_handle(inputs), 0, PIXELS
            )
        )
        grpc.unregister_cuda_shared_memory("pixels")
        gone = failure(lambda: infer_in_cuda(rest, "http", MODEL, ROWS))
        rest.unregister_cuda_shared_memory()
    finally:
        rest.close()
        grpc.close()
    assert np.array_equal(got.argmax(axis=1), reference(appliance, pixels).argmax(axis=1))
    assert "already registered" in taken.message()
    assert "already registered" in again.message()
    assert "region named 'pixels'" in gone.message()


def test_no_frontend_process_holds_the_gpu(
    appliance: Appliance,
    cudashm: ModuleType,
    regions: Regions,
    pixels: npt.NDArray[np.float32],
) -> None:
    """After CUDA-shm requests over both transports, only model workers have a CUDA context."""
    inputs, outputs = regions.make("pixels", PIXELS), regions.make("probs", PROBABILITIES)
    cudashm.set_shared_memory_region(inputs, [pixels])
    for transport in ("grpc", "http"):
        client = connect(appliance, transport)
        try:
            register(client, cudashm, inputs, outputs)
            for model in (MODEL, "digits"):
                infer_in_cuda(client, transport, model, ROWS)
            client.unregister_cuda_shared_memory()
        finally:
            client.close()
    held = gpu_processes()
    if held is None:
        pytest.skip("nvidia-smi is not usable here: cannot see which processes hold the GPU")
    master = psutil.Process(appliance.process.pid)
    tree = {master.pid, *(child.pid for child in master.children(recursive=True))}
    workers = {p["pid"] for p in appliance.processes() if p["role"].startswith("model")}
    others = tree - workers  # the master, the frontends and their workers
    if not held.keys() & workers:
        pytest.skip(
            f"nvidia-smi shows no model worker (pids {sorted(held)}): another PID namespace"
        )
    assert not held.keys() & others, {pid: held[pid] for pid in held.keys() & others}


def test_an_output_region_too_small_is_refused_by_the_worker_with_the_sizes(
    appliance: Appliance, cudashm: ModuleType, regions: Regions, pixels: npt.NDArray[np.float32]
) -> None:
    inputs, outputs = regions.make("pixels", PIXELS), regions.make("probs", PROBABILITIES)
    cudashm.set_shared_memory_region(inputs, [pixels])
    client = connect(appliance, "grpc")
    try:
        register(client, cudashm, inputs, outputs, probs_bytes=64)
        small = failure(lambda: infer_in_cuda_sized(client, MODEL, 64))
        client.unregister_cuda_shared_memory()
    finally:
        client.close()
    assert f"output probabilities needs {PROBABILITIES} bytes" in small.message()
    assert "shared_memory_byte_size is 64 (region 'probs')" in small.message()


def infer_in_cuda_sized(client: Any, model: str, output_bytes: int) -> Any:
    tensor = grpcclient.InferInput("pixels", [ROWS, 64], "FP32")
    tensor.set_shared_memory("pixels", PIXELS)
    wanted = grpcclient.InferRequestedOutput("probabilities")
    wanted.set_shared_memory("probs", output_bytes)
    return client.infer(model, [tensor], outputs=[wanted])


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_bad_cuda_registrations_are_refused_with_the_reason(
    appliance: Appliance, cudashm: ModuleType, regions: Regions, transport: str
) -> None:
    small = regions.make("small", 64)
    client = connect(appliance, transport)
    try:
        handle = cudashm.get_raw_handle(small)
        short = failure(
            lambda: client.register_cuda_shared_memory("r", base64.b64encode(b"x" * 10), 0, 64)
        )
        device = failure(lambda: client.register_cuda_shared_memory("r", handle, 7, 64))
        size = failure(lambda: client.register_cuda_shared_memory("r", handle, 0, 1 << 30))
        listed = client.get_cuda_shared_memory_status()
    finally:
        client.close()
    assert "64 bytes of a cudaIpcMemHandle_t, got 10" in short.message()
    assert "device_id 7 is not one of this host's" in device.message()
    assert "fewer than byte_size 1073741824" in size.message()
    assert len(listed.regions if transport == "grpc" else listed) == 0
    assert reference(appliance, np.zeros((1, 64), np.float32)).shape == (1, 10)


@triton_examples.needs_examples
@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_triton_cudashm_example_passes_unmodified(
    appliance: Appliance, transport: str, tmp_path: Path
) -> None:
    example = f"simple_{transport}_cudashm_client.py"
    done = triton_examples.run(example, f"127.0.0.1:{appliance.ports[transport]}", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: cuda" in done.stdout
