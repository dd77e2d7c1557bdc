"""Fields of Triton's model config served by real Triton and by the appliance, call by call.

tests/data/triton_config_models holds Python-backend models whose
config.pbtxt uses them (optional inputs, model_warmup, ...). Both servers
serve a copy; the same tritonclient calls over REST and gRPC must get the
same answers. What the appliance answers otherwise on purpose is named in
``ON_PURPOSE`` and documented in docs/models/triton-config.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from bench.servers import PeerServer
from tests.peers.conftest import triton_serving
from tests.peers.oracle import (
    Call,
    assert_on_purpose,
    differences,
    outputs,
    tensor,
    urls_of,
)
from tests.peers.oracle import both as oracle_both
from tests.system.harness import Appliance, make_config, new_run_dir, serving
from tests.triton_config_repository import copy_to

pytestmark = pytest.mark.peers

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
    Call(
        "reshaped tensors",
        lambda m, c: outputs(
            c.infer(
                "reshaped", [tensor(m, "IN", np.arange(8, dtype=np.float32).reshape(2, 4), "FP32")]
            ),
            "OUT",
            "SEEN",
        ),
    ),
    Call(
        "reshaped tensors' metadata",
        lambda m, c: [
            (t["name"], [int(d) for d in t["shape"]])
            for kind in ("inputs", "outputs")
            for t in (
                c.get_model_metadata("reshaped", as_json=True)
                if m is grpcclient
                else c.get_model_metadata("reshaped")
            )[kind]
        ],
    ),
    Call(
        "a reshaped input of the wrong size",
        lambda m, c: c.infer("reshaped", [tensor(m, "IN", np.zeros((1, 3), np.float32), "FP32")]),
        ("IN", "reshaped"),
    ),
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
# Answered otherwise on purpose: call -> (REST status, gRPC status, why); Triton's
# answer is an error too unless TRITON_ANSWERS names the call.
ON_PURPOSE = {
    "required input left out beside an optional one": (
        "400",
        "StatusCode.INVALID_ARGUMENT",
        "Triton checks only the number of inputs when a model has optional ones, and hands "
        "execute a request without its required input (500 from the model); the appliance "
        "refuses it, naming the missing input",
    ),
}
ON_PURPOSE["priority out of range"] = (
    "400",
    "StatusCode.INVALID_ARGUMENT",
    "Triton runs a request whose priority is not one of the model's levels at the default "
    "level; the appliance refuses it, naming the levels, so a client learns its priority "
    "is not honoured",
)
TRITON_ANSWERS = {"priority out of range"}
ON_PURPOSE_CALLS = [
    Call(
        "required input left out beside an optional one",
        lambda m, c: c.infer("optional_in", [tensor(m, "B", A, "FP32")]),
        ("optional_in", "A"),
    ),
    Call(
        "priority out of range",
        lambda m, c: c.infer(
            "prioritized", [tensor(m, "TAG", np.array([[0]], np.int32), "INT32")], priority=7
        ),
        ("priority 7", "prioritized", "1 (highest) to 3"),
    ),
]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("config-oracle")
    copy_to(root)
    return root


CACHE_BYTES = 1 << 20


@pytest.fixture(scope="module")
def triton(repository: Path) -> Iterator[PeerServer]:
    options = ["--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false"]
    options.append(f"--cache-config=local,size={CACHE_BYTES}")
    with triton_serving(repository, options) as server:
        yield server


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    config = make_config(new_run_dir(), [])
    config["server"]["response_cache_bytes"] = CACHE_BYTES
    config["repositories"] = [{"path": str(repository)}]
    with serving(config) as started:
        yield started


def both(
    triton: PeerServer, appliance: Appliance, transport: str, calls: list[Call]
) -> tuple[dict[str, Any], dict[str, Any]]:
    return oracle_both(triton.urls, urls_of(appliance), transport, calls)


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
    assert_on_purpose(theirs, ours, ON_PURPOSE_CALLS, ON_PURPOSE, transport, TRITON_ANSWERS)


# Requests sent one after another to a model that runs one at a time: (tag, the
# infer call's keyword arguments, seconds before the next is sent). The first of
# each holds the instance a while ("sleep"), so the others queue behind it.
SCENARIOS = {
    "priorities pick the order": (
        "queued",
        [
            (1, {"parameters": {"sleep": 0.6}}, 0.2),
            (2, {}, 0.05),
            (3, {"priority": 1}, 0.05),
            (4, {"priority": 2}, 0.0),
        ],
    ),
    "a full level refuses": (
        "queued",
        [(10, {"parameters": {"sleep": 1.0}}, 0.2)] + [(t, {}, 0.05) for t in range(11, 16)],
    ),
    "a request past its queue timeout is refused": (
        "rejecting",
        [(20, {"parameters": {"sleep": 1.0}}, 0.2), (21, {}, 0.0)],
    ),
    "a request past its queue timeout waits behind those in time": (
        "expiring",
        # 31 (sent at 0.2 s) waits past its 1 s before the instance is free at 2 s;
        # 32 (sent at 1.5 s) does not. Half a second either way: on a busy host a
        # send late by 0.2 s had 32 queued after the instance freed (Triton ran 31).
        [(30, {"parameters": {"sleep": 2.0}}, 0.2), (31, {}, 1.3), (32, {}, 0)],
    ),
}


def scheduled(url: str) -> dict[str, dict[int, Any]]:
    """Each scenario's answers by tag: the tags run before it (its own last), or its
    error's status and the words Triton's message holds."""

    def one(model: str, tag: int, kwargs: dict[str, Any], seen: dict[int, Any]) -> None:
        client = httpclient.InferenceServerClient(url)
        try:
            x = tensor(httpclient, "TAG", np.array([[tag]], np.int32), "INT32")
            ran = client.infer(model, [x], **kwargs).as_numpy("RAN")[0][0]
            seen[tag] = json.loads(ran)[-4:]
        except InferenceServerException as ex:
            words = ("Exceeds maximum queue size", "Request timeout expired")
            seen[tag] = (ex.status(), [w for w in words if w in str(ex.message())])
        finally:
            client.close()

    found = {}
    for name, (model, plan) in SCENARIOS.items():
        seen: dict[int, Any] = {}
        threads = []
        for tag, kwargs, pause in plan:
            thread = threading.Thread(target=one, args=(model, tag, kwargs, seen))
            thread.start()
            threads.append(thread)
            time.sleep(pause)
        for thread in threads:
            thread.join(30)
        found[name] = dict(sorted(seen.items()))
    return found


def failures(metrics_url: str) -> dict[tuple[str, str], float]:
    """nv_inference_request_failure by model and reason, for the models that refuse."""
    text = requests.get(f"http://{metrics_url}/metrics", timeout=10).text
    return {
        (sample.labels["model"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "nv_inference_request_failure"
        for sample in family.samples
        if sample.labels["model"] in ("queued", "rejecting")
    }


def test_priorities_and_queue_policies_order_and_refuse_as_triton_does(
    triton: PeerServer, appliance: Appliance
) -> None:
    theirs = scheduled(triton.urls["http"])
    url = urls_of(appliance)["http"]
    ours = scheduled(url)
    assert ours == theirs
    counted, triton_counted = failures(url), failures(triton.urls["metrics"])
    # On purpose: Triton leaves a refusal by a full queue out of its failures; the
    # appliance counts it as REJECTED, as it counts one past its queue timeout.
    assert triton_counted.pop(("queued", "REJECTED")) == 0
    assert counted.pop(("queued", "REJECTED")) == 1
    assert counted == triton_counted
    assert triton_counted[("rejecting", "REJECTED")] == 1
    assert theirs["priorities pick the order"][4][-4:] == [1, 3, 2, 4]
    assert theirs["a full level refuses"][15] == ("503", ["Exceeds maximum queue size"])
    refused = theirs["a request past its queue timeout is refused"][21]
    assert refused == ("503", ["Request timeout expired"])
    delayed = theirs["a request past its queue timeout waits behind those in time"][31]
    assert delayed[-3:] == [30, 32, 31]


def cache_seen(http_url: str, metrics_url: str) -> dict[str, Any]:
    """cached's answers to X = 1, 1, 2, 1 (RUNS: executions so far), then its statistics,
    config and cache metrics."""
    client = httpclient.InferenceServerClient(http_url)
    try:
        runs = []
        for value in (1, 1, 2, 1):
            x = tensor(httpclient, "X", np.full((1, 2), value, np.float32), "FP32")
            runs.append(int(client.infer("cached", [x]).as_numpy("RUNS")[0][0]))
        stats = client.get_inference_statistics("cached")["model_stats"][0]
        config = client.get_model_config("cached")
    finally:
        client.close()
    counts = {key: stats["inference_stats"][key]["count"] for key in ("success", "cache_hit")}
    counts["cache_miss"] = stats["inference_stats"]["cache_miss"]["count"]
    text = requests.get(f"http://{metrics_url}/metrics", timeout=10).text
    families = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("nv_cache_") and family.name.endswith("_per_model"):
            for sample in family.samples:
                if sample.labels.get("model") == "cached":
                    number = sample.value if "num_" in family.name else sample.value > 0
                    families[family.name] = (sorted(sample.labels), number)
        elif family.name == "nv_inference_request_success":
            families[family.name] = [
                s.value for s in family.samples if s.labels["model"] == "cached"
            ]
    return {
        "runs": runs,
        "counts": counts,
        "executions": (stats["inference_count"], stats["execution_count"]),
        "config": config.get("response_cache"),
        "metrics": families,
    }


def test_a_repeated_request_is_answered_from_the_cache_as_triton_answers_it(
    triton: PeerServer, appliance: Appliance
) -> None:
    theirs = cache_seen(triton.urls["http"], triton.urls["metrics"])
    url = urls_of(appliance)["http"]
    ours = cache_seen(url, url)
    assert ours == theirs
    assert theirs["runs"] == [1, 1, 2, 1]
    assert theirs["counts"] == {"success": 4, "cache_hit": 2, "cache_miss": 2}
    assert theirs["metrics"]["nv_cache_num_hits_per_model"] == (["model", "version"], 2)
