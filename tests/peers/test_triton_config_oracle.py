"""Fields of Triton's model config served by real Triton and by the appliance, call by call.

tests/data/triton_config_models holds Python-backend models whose
config.pbtxt uses them (optional inputs, model_warmup, ...). Both servers
serve a copy; the same tritonclient calls over REST and gRPC must get the
same answers. What the appliance answers otherwise on purpose is named in
``ON_PURPOSE`` and documented in docs/models/triton-config.md.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from bench.servers import PeerServer
from tests.peers.conftest import triton_serving
from tests.peers.oracle import Call, answers, differences, outputs, tensor, transports
from tests.system.harness import ROOT, Appliance, serving_repository

pytestmark = pytest.mark.peers

MODELS = ROOT / "tests" / "data" / "triton_config_models"
A = np.ones((2, 2), dtype=np.float32)


def config_of(model: str) -> Call:
    """What a client reads of a model's inputs in its config, ``optional`` with them."""

    def read(m: ModuleType, c: Any) -> list[Any]:
        config = c.get_model_config(model, as_json=True) if m is grpcclient else None
        config = config["config"] if config else c.get_model_config(model)
        return [
            (t["name"], t["data_type"], [int(d) for d in t["dims"]], t.get("optional", False))
            for t in config["input"]
        ]

    return Call(f"config {model}", read)


def warmup_seen(m: ModuleType, c: Any) -> list[Any]:
    """What warm's execute had been given before this request: the warmup samples."""
    x = tensor(m, "X", np.full((1, 3), 7, np.float32), "FP32")
    return json.loads(c.infer("warm", [x]).as_numpy("SEEN")[0][0])


def normal_warmup(config: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**sample, "count": int(sample.get("count", 0))} for sample in config]


CALLS = [
    Call(
        "optional input left out",
        lambda m, c: outputs(c.infer("optional_in", [tensor(m, "A", A, "FP32")]), "SUM", "HAS_B"),
    ),
    Call(
        "optional input given",
        lambda m, c: outputs(
            c.infer("optional_in", [tensor(m, "A", A, "FP32"), tensor(m, "B", A * 3, "FP32")]),
            "SUM",
            "HAS_B",
        ),
    ),
    config_of("optional_in"),
    Call("warmup samples ran before the first request", warmup_seen),
    Call(
        "warmup samples in the config",
        lambda m, c: normal_warmup(
            (
                c.get_model_config("warm", as_json=True)["config"]
                if m is grpcclient
                else c.get_model_config("warm")
            )["model_warmup"]
        ),
    ),
]
# Answered otherwise on purpose: call -> (REST status, gRPC status, why).
ON_PURPOSE = {
    "required input left out beside an optional one": (
        "400",
        "StatusCode.INVALID_ARGUMENT",
        "Triton checks only the number of inputs when a model has optional ones, and hands "
        "execute a request without its required input (500 from the model); the appliance "
        "refuses it, naming the missing input",
    ),
}
ON_PURPOSE_CALLS = [
    Call(
        "required input left out beside an optional one",
        lambda m, c: c.infer("optional_in", [tensor(m, "B", A, "FP32")]),
        ("optional_in", "A"),
    )
]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config-oracle")
    shutil.copytree(MODELS, root, dirs_exist_ok=True)
    (root / "README.md").unlink()
    return root


@pytest.fixture(scope="module")
def triton(repository: Path) -> Iterator[PeerServer]:
    options = ["--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false"]
    with triton_serving(repository, options) as server:
        yield server


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    with serving_repository(repository) as started:
        yield started


def both(
    triton: PeerServer, appliance: Appliance, transport: str, calls: list[Call]
) -> tuple[dict[str, Any], dict[str, Any]]:
    index = 0 if transport == "http" else 1
    module, triton_url = transports(triton.urls)[index]
    ours = {kind: f"127.0.0.1:{appliance.ports[kind]}" for kind in ("http", "grpc")}
    _, appliance_url = transports(ours)[index]
    return answers(module, triton_url, calls), answers(module, appliance_url, calls)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_every_call_answers_as_triton_answers(
    triton: PeerServer, appliance: Appliance, transport: str
) -> None:
    theirs, ours = both(triton, appliance, transport, CALLS)
    parted = differences(theirs, ours, CALLS)
    assert not parted, "\n".join(parted)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_where_the_appliance_answers_otherwise_it_is_on_purpose(
    triton: PeerServer, appliance: Appliance, transport: str
) -> None:
    theirs, ours = both(triton, appliance, transport, ON_PURPOSE_CALLS)
    for call in ON_PURPOSE_CALLS:
        rest, grpc, why = ON_PURPOSE[call.name]
        assert theirs[call.name][0] == "error", f"{call.name}: Triton now answers {theirs}"
        assert ours[call.name][:2] == ("error", rest if transport == "http" else grpc), why
        assert all(word in ours[call.name][2] for word in call.words), ours
