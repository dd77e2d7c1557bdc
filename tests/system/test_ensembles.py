"""Ensembles: graphs of served models, called as a model by every protocol, with no copy.

One appliance serves a few small models and ensembles of them, declared as
[[models]] tables with steps. The inline threshold is 64 bytes, so every
tensor here goes through the rings: that is what the ensembles must pass on
without copying, and give back when done.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.client.api import ModelClient
from appliance.core.status import Counter, Role, SlotState
from appliance.errors import DeadlineExceeded, ModelFailed, ModelNotReady, Unsupported
from tests.system.harness import (
    Appliance,
    counted,
    demo_models,
    eventually,
    make_config,
    new_run_dir,
    serving,
)
from tests.system.protocol_load import CLIENTS

# GraphPipe's client builds flatbuffers the deprecated way.
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")
F32 = {"dtype": "FP32", "shape": [-1, -1]}


def tensor(name: str, **keys: Any) -> dict[str, Any]:
    return {"name": name, **F32, **keys}


def link(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> dict[str, Any]:
    return {"model": model, "input_map": inputs, "output_map": outputs}


def ensemble(name: str, steps: list[dict[str, Any]], **keys: Any) -> dict[str, Any]:
    table = {
        "name": name,
        "platform": "ensemble",
        "inputs": [tensor("IN")],
        "outputs": [tensor("OUT")],
        "steps": steps,
    }
    table.update(keys)
    return table


def identities(name: str, first: str) -> dict[str, Any]:
    """IN -> ``first`` -> identity -> identity -> OUT."""
    return ensemble(
        name,
        [
            link(first, {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
            link("identity", {"INPUT0": "a"}, {"OUTPUT0": "b"}),
            link("identity", {"INPUT0": "b"}, {"OUTPUT0": "OUT"}),
        ],
    )


INT16 = {"dtype": "INT32", "shape": [-1, 16]}
SCALED = {"dtype": "FP32", "shape": [-1, 4]}
MODELS: list[dict[str, Any]] = [
    *demo_models("identity", "custom_identity_int32", "simple"),
    {"name": "identity_copy", "class": "appliance.demos.identity:Identity", "passthrough": False},
    {"name": "failing", "class": "tests.models:Failing"},
    {"name": "slow", "class": "tests.models:Slow"},
    {"name": "doubled", "class": "tests.models:Scaled", "options": {"factor": 2.0}},
    {"name": "tripled", "class": "tests.models:Scaled", "options": {"factor": 3.0}},
    identities("passes", "identity"),
    identities("copies", "identity_copy"),
    # Two consumers of X, and a step with two producers.
    ensemble(
        "dag",
        [
            link("custom_identity_int32", {"INPUT0": "X"}, {"OUTPUT0": "a"}),
            link("custom_identity_int32", {"INPUT0": "X"}, {"OUTPUT0": "b"}),
            link("simple", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
        ],
        max_batch_size=8,
        inputs=[{"name": "X", **INT16}],
        outputs=[{"name": "SUM", **INT16}, {"name": "DIFF", **INT16}],
    ),
    ensemble(
        "six",
        [
            link("doubled", {"x": "x"}, {"y": "twice"}),
            link("tripled", {"x": "twice"}, {"y": "y"}),
        ],
        max_batch_size=16,
        inputs=[{"name": "x", **SCALED}],
        outputs=[{"name": "y", **SCALED}],
    ),
    ensemble(
        "fails",
        [
            link("identity_copy", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
            link("failing", {"x": "a"}, {"y": "OUT"}),
        ],
    ),
    ensemble(
        "slow_pair",
        [link("slow", {"x": "IN"}, {"y": "a"}), link("slow", {"x": "a"}, {"y": "OUT"})],
        inputs=[{"name": "IN", "dtype": "FP32", "shape": [-1]}],
        outputs=[{"name": "OUT", "dtype": "FP32", "shape": [-1]}],
    ),
]


# The ensemble of Triton's architecture guide (docs/user_guide/architecture.md),
# as it writes it: one step's output read by two steps. Its three models are
# stand-ins (tests/models.py) served as [[models]] beside its repository.
ARCHITECTURE = (
    Path(__file__).parent.parent / "data" / "triton_architecture_ensemble.pbtxt"
).read_text()
STAND_INS = [
    {"name": "image_preprocess_model", "class": "tests.models:ImagePreprocess"},
    {"name": "classification_model", "class": "tests.models:Classification"},
    {"name": "segmentation_model", "class": "tests.models:Segmentation"},
]


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    run_dir = new_run_dir()
    config = make_config(
        run_dir,
        [*MODELS, *STAND_INS],
        shm={"inline_threshold_bytes": 64},
        mip={"listeners": [{"port": 0, "model": "six"}]},
    )
    repository = Path(tempfile.mkdtemp(prefix="repo-", dir="/tmp"))
    (repository / "ensemble_model" / "1").mkdir(parents=True)
    (repository / "ensemble_model" / "config.pbtxt").write_text(ARCHITECTURE)
    config["repositories"] = [{"path": str(repository)}]
    try:
        with serving(config) as started:
            yield started
    finally:
        shutil.rmtree(repository, ignore_errors=True)


@pytest.fixture
def client(appliance: Appliance) -> ModelClient:
    return appliance.client()


def ring_used(client: ModelClient, model: str) -> int:
    """Bytes in use in the response rings of ``model``'s instances."""
    used = 0
    for info in client.status.occupied():
        if info.role is Role.MODEL and info.name == model and info.state is SlotState.READY:
            used += info.ring[0] + info.ring[2]
    return used


def all_given_back(client: ModelClient) -> bool:
    """Nothing is held in any ring: the models', the frontends' and this client's."""
    busy = [info.ring for info in client.status.occupied() if info.ring[0] or info.ring[2]]
    return not busy and client.ring_used_bytes == 0


def test_a_chain_passes_its_tensors_on_without_copying_them(client: ModelClient) -> None:
    x = np.arange(256 * 1024, dtype=np.float32).reshape(512, 512)  # 1 MiB
    with client.infer("passes", {"IN": x}) as result:
        assert np.array_equal(result.array("OUT"), x)
        # Every step passed the block it read on: the answer is the request's
        # own block, and no worker holds a byte.
        assert client.ring_used_bytes >= x.nbytes
        assert ring_used(client, "identity") == 0
    with client.infer("copies", {"IN": x}) as result:
        assert np.array_equal(result.array("OUT"), x)
        # The first step copied once into its ring; the next two read it there.
        # A worker shows its ring's use after it has sent its replies, so the
        # answer can come back before the status table says what is held.
        assert eventually(lambda: ring_used(client, "identity_copy") >= x.nbytes, 5.0)
        assert ring_used(client, "identity") == 0
        assert client.ring_used_bytes == 0
    assert eventually(lambda: all_given_back(client), 5.0)


def test_a_dag_runs_two_consumers_of_one_tensor_and_a_step_with_two_producers(
    client: ModelClient,
) -> None:
    x = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)
    with client.infer("dag", {"X": x}) as result:
        assert np.array_equal(result.array("SUM"), 2 * x)
        assert np.array_equal(result.array("DIFF"), np.zeros_like(x))
    with client.infer("dag", {"X": x[:2]}, outputs=["DIFF"]) as result:
        assert list(result.outputs) == ["DIFF"]
    assert eventually(lambda: all_given_back(client), 5.0)


def test_tritons_architecture_guide_ensemble_serves_as_triton_writes_it(
    appliance: Appliance, client: ModelClient
) -> None:
    image = np.array([[b"\x89PNG" + bytes(60)]], dtype=object)  # 64 bytes
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        raw = grpcclient.InferInput("IMAGE", [1, 1], "BYTES")
        raw.set_data_from_numpy(image)
        answer = grpc.infer("ensemble_model", [raw])
        config = grpc.get_model_config("ensemble_model", as_json=True)["config"]
    finally:
        grpc.close()
    assert answer.as_numpy("CLASSIFICATION").shape == (1, 1000)
    assert np.all(answer.as_numpy("CLASSIFICATION") == 64)
    assert np.all(answer.as_numpy("SEGMENTATION") == 128)
    assert answer.as_numpy("SEGMENTATION").shape == (1, 3, 224, 224)
    assert len(config["ensemble_scheduling"]["step"]) == 3
    assert eventually(lambda: all_given_back(client), 5.0)


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_every_protocol_calls_an_ensemble_as_a_model(appliance: Appliance, protocol: str) -> None:
    call, close = CLIENTS[protocol](appliance, "six")
    try:
        x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
        assert np.allclose(call(x), 6 * x)
    finally:
        close()


def test_a_failing_step_fails_the_request_naming_the_step_and_its_model(
    appliance: Appliance, client: ModelClient
) -> None:
    x = np.ones((64, 64), np.float32)
    expected = "ensemble fails, step 1 (model failing): model failing failed: RuntimeError"
    with pytest.raises(ModelFailed, match=r"ensemble fails, step 1 \(model failing\)"):
        client.infer("fails", {"IN": x})
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        tensor = httpclient.InferInput("IN", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as refused:
            rest.infer("fails", [tensor])
    finally:
        rest.close()
    assert expected in str(refused.value)
    with pytest.raises(Unsupported, match="fails is an ensemble: it answers predictions"):
        list(client.stream("fails", {"IN": x}))
    assert eventually(lambda: all_given_back(client), 5.0)


def test_a_deadline_mid_chain_names_the_step_and_gives_the_space_back(
    client: ModelClient,
) -> None:
    x = np.ones(64 * 1024, np.float32)
    with pytest.raises(DeadlineExceeded, match=r"ensemble slow_pair, step 1 \(model slow\)"):
        client.infer("slow_pair", {"IN": x}, parameters={"sleep_s": 0.3}, timeout_s=0.45)
    # The second step still ran, reading the first one's output: that space
    # comes back with its late reply, which this client's channel takes in
    # while it waits for the next call's (queued behind it on that worker).
    assert client.ring_used_bytes >= x.nbytes
    with client.infer("slow_pair", {"IN": x}) as result:
        assert np.array_equal(result.array("OUT"), x)
    assert eventually(lambda: all_given_back(client), 5.0)


def test_a_cancelled_call_sends_no_further_step(client: ModelClient) -> None:
    x = np.ones(64 * 1024, np.float32)
    before = client.counters("slow")

    async def cancel_then_call() -> None:
        slow = {"sleep_s": 0.3}
        task = asyncio.create_task(client.infer_async("slow_pair", {"IN": x}, parameters=slow))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # On the same loop, whose channel takes the late reply in meanwhile.
        result = await client.infer_async("slow_pair", {"IN": x})
        with result:
            assert np.array_equal(result.array("OUT"), x)

    asyncio.run(cancel_then_call())
    # The cancelled call's first step ran; its second never did.
    after = counted(client, "slow", 3, before)
    assert after[Counter.SUCCESS] - before[Counter.SUCCESS] == 3
    assert eventually(lambda: all_given_back(client), 5.0)


def test_readiness_metadata_statistics_and_metrics_of_an_ensemble(
    appliance: Appliance, client: ModelClient
) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    try:
        before = {
            model: client.counters(model)[Counter.SUCCESS] for model in ("doubled", "tripled")
        }
        for _ in range(3):
            tensor = httpclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            rest.infer("six", [tensor])
        ready = rest.is_model_ready("six")
        metadata = rest.get_model_metadata("six")
        config = rest.get_model_config("six")
        stats = rest.get_inference_statistics("six")["model_stats"][0]
        index = {entry["name"]: entry for entry in rest.get_model_repository_index()}
    finally:
        rest.close()
    assert ready
    assert index["six"]["state"] == "READY"
    assert metadata["platform"] == "ensemble"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert config["max_batch_size"] == 16
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    steps = config["ensemble_scheduling"]["step"]
    assert [step["model_name"] for step in steps] == ["doubled", "tripled"]
    assert stats["inference_stats"]["success"]["count"] >= 3
    # Each step is an ordinary call of its model, counted as such.
    for model, count in before.items():
        assert eventually(lambda m=model, c=count: client.counters(m)[Counter.SUCCESS] >= c + 3, 5)
    text = requests.get(f"http://127.0.0.1:{appliance.ports['http']}/metrics", timeout=10).text
    for model in ("six", "doubled", "tripled"):
        assert _has_ok(text, model), model
    assert 'appliance_model_ready{model="six"} 1.0' in text


def _has_ok(text: str, model: str) -> bool:
    return any(
        line.startswith("appliance_model_requests_total{")
        and f'model="{model}"' in line
        and 'outcome="ok"' in line
        for line in text.splitlines()
    )


def test_a_step_model_unloaded_makes_the_ensemble_not_ready_until_loaded(
    appliance: Appliance, client: ModelClient
) -> None:
    x = np.ones((4, 4), np.float32)
    client.unload_model("tripled")
    try:
        assert eventually(lambda: not client.model_ready("six"), 10.0)
        assert "six" in client.models()
        with pytest.raises(ModelNotReady, match=r"ensemble six, step 1 \(model tripled\)"):
            client.infer("six", {"x": x}, timeout_s=1.0)
    finally:
        client.load_model("tripled")
    with client.infer("six", {"x": x}) as result:
        assert np.allclose(result.array("y"), 6 * x)
    # The refused run gave back step 0's output, which step 1 never read.
    assert eventually(lambda: all_given_back(client), 5.0)


def test_a_step_that_cannot_be_sent_gives_its_inputs_back(client: ModelClient) -> None:
    x = np.ones((64, 1024), np.float32)  # past the inline threshold: step 0 answers in its ring
    client.unload_model("identity")
    try:
        with pytest.raises(ModelNotReady, match=r"ensemble copies, step 1 \(model identity\)"):
            client.infer("copies", {"IN": x}, timeout_s=1.0)
        # Step 0's output, which step 1 was to read, is given back to its worker.
        assert eventually(lambda: all_given_back(client), 5.0)
    finally:
        client.load_model("identity")
    with client.infer("copies", {"IN": x}) as result:
        assert np.array_equal(result.array("OUT"), x)
