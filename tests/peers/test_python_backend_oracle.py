"""Triton's Python-backend models served by real Triton and by the appliance, call by call.

One repository (a copy of tests/data/python_models: models that answer,
batch, auto-complete their config, misbehave in execute, fail to import or
to initialize) is served by tritonserver 2.51 and by the appliance. The same
tritonclient calls go to both over REST and over gRPC, and their answers
must agree: outputs, metadata, the config's tensors, the repository index,
and for errors the status and what the message names.

Where the appliance answers otherwise on purpose, the test says so by name
(``ON_PURPOSE``) and checks the appliance's own answer; the docs list the
same (docs/models/python-backend.md).
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import PeerServer
from tests.batch_probe import REQUESTS, batch_answers
from tests.peers.oracle import (
    Call,
    answers,
    assert_on_purpose,
    differences,
    tensor,
    transports,
    urls_of,
)
from tests.peers.python_backend_calls import (
    CALLS,
    F4,
    MODELS,
    ON_PURPOSE,
    ON_PURPOSE_CALLS,
    add_sub,
    instance_names,
)
from tests.peers.triton_again import Peer, triton_answers
from tests.sequence_streams import sequence_streamed
from tests.system.harness import Appliance, serving_repository

pytestmark = pytest.mark.peers


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oracle")
    shutil.copytree(MODELS, root, dirs_exist_ok=True)
    return root


@pytest.fixture(scope="module")
def triton_peer(repository: Path) -> Iterator[Peer]:
    peer = Peer(repository)
    try:
        yield peer
    finally:
        peer.close()


@pytest.fixture
def triton(triton_peer: Peer) -> PeerServer:
    return triton_peer.live()


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    with serving_repository(repository) as started:
        yield started


def both(
    peer: Peer, appliance: Appliance, transport: str, calls: list[Call]
) -> tuple[dict[str, Any], dict[str, Any]]:
    theirs = triton_answers(peer, transport, calls)
    module, url = transports(urls_of(appliance))[0 if transport == "http" else 1]
    return theirs, answers(module, url, calls)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_every_call_answers_as_triton_answers(
    triton_peer: Peer, appliance: Appliance, transport: str
) -> None:
    theirs, ours = both(triton_peer, appliance, transport, CALLS)
    parted = differences(theirs, ours, CALLS)
    assert not parted, "\n".join(parted)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_where_the_appliance_answers_otherwise_it_is_on_purpose(
    triton_peer: Peer, appliance: Appliance, transport: str
) -> None:
    theirs, ours = both(triton_peer, appliance, transport, ON_PURPOSE_CALLS)
    assert_on_purpose(theirs, ours, ON_PURPOSE_CALLS, ON_PURPOSE, transport)


def test_concurrent_requests_reach_execute_as_triton_batches_them(
    triton: PeerServer, appliance: Appliance
) -> None:
    found: dict[str, list[tuple[int, bool, str]]] = {}
    urls = {"triton": triton.urls["http"], "appliance": urls_of(appliance)["http"]}
    threads = [
        threading.Thread(target=lambda k=k, u=u: found.__setitem__(k, batch_answers(u)))
        for k, u in urls.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for server in urls:
        answered = found[server]
        # Requests that queued behind a slow execute came in one list...
        assert max(count for count, _w, _t in answered) > 1, (server, answered)
        # ...each with its own parameters, answered in order.
        assert [tag for _c, _w, tag in answered] == [f"t{n}" for n in range(REQUESTS)], server
    # On purpose: Triton copies each input into its stub and hands execute a
    # writable array; the appliance hands a read-only view of the shared memory
    # the request arrived in (no copy), and a model.py that writes into one is
    # told to copy it first (test_python_backend.py).
    assert {w for _c, w, _t in found["triton"]} == {True}
    assert {w for _c, w, _t in found["appliance"]} == {False}


def streamed(url: str, requests: list[int], empty_final: bool) -> dict[str, list[Any]]:
    """square_stream's answers on one gRPC stream, by request id, in the order each came."""
    client = grpcclient.InferenceServerClient(url)
    parts: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: parts.put((result, error)))
    try:
        for n in requests:
            x = tensor(grpcclient, "IN", np.array([n], np.int32), "INT32")
            client.async_stream_infer(
                "square_stream", [x], request_id=f"n{n}", enable_empty_final_response=empty_final
            )
        # Each request ends with its final response when it asked for one (an
        # error comes before it), else with its last part or its error.
        ends = 0
        got: dict[str, list[Any]] = {}
        while ends < len(requests):
            result, error = parts.get(timeout=30)
            if error is not None:
                got.setdefault("errors", []).append(error.message())
                ends += not empty_final
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            data = (result.as_numpy("OUT"), result.as_numpy("IDX"), result.as_numpy("ID"))
            plain = [None if array is None else array.tolist() for array in data]
            got.setdefault(response.id, []).append((*plain, final))
            ends += final or (not empty_final and plain[1] == [int(response.id[1:]) - 1])
    finally:
        client.stop_stream()
        client.close()
    return got


def test_a_decoupled_sequence_model_streams_each_step_as_triton_does(
    triton: PeerServer, appliance: Appliance
) -> None:
    steps = [(81, 3, "start"), (81, 4, ""), (81, 5, "end"), (82, 7, "both")]
    theirs = sequence_streamed(triton.urls["grpc"], steps)
    ours = sequence_streamed(urls_of(appliance)["grpc"], steps)
    assert ours == theirs
    assert [step[0] for step in ours] == [("SUM", [3]), ("SUM", [7]), ("SUM", [12]), ("SUM", [7])]


@pytest.mark.parametrize("empty_final", [False, True])
def test_a_decoupled_model_streams_what_triton_streams(
    triton: PeerServer, appliance: Appliance, empty_final: bool
) -> None:
    # Without the empty final response, a request of n = 0 sends nothing.
    requests = [3, 1, -1] if not empty_final else [2, 0, -1]
    theirs = streamed(triton.urls["grpc"], requests, empty_final)
    ours = streamed(urls_of(appliance)["grpc"], requests, empty_final)
    assert ours == theirs
    assert theirs["errors"] == ["IN must be >= 0"]


def probe_metrics(http_url: str, metrics_url: str) -> tuple[list[float], list[Any]]:
    """metrics_probe's answers to inputs 2, 5 and 20, then its families on /metrics:
    name, type, help and samples, parsed (the two servers format numbers apart)."""
    client = httpclient.InferenceServerClient(http_url)
    try:
        answers = []
        for x in (2.0, 5.0, 20.0):
            inputs = [tensor(httpclient, "X", np.array([x], np.float32), "FP32")]
            result = client.infer("metrics_probe", inputs)
            answers.append(float(result.as_numpy("VALUE")[0]))
    finally:
        client.close()
    text = requests.get(f"http://{metrics_url}/metrics", timeout=10).text
    families = []
    for family in text_string_to_metric_families(text):
        if family.name.startswith("probe_"):
            samples = sorted(
                (
                    sample.name,
                    sorted(
                        (k, str(float(v)) if k == "le" else v) for k, v in sample.labels.items()
                    ),
                    sample.value,
                )
                for sample in family.samples
            )
            families.append((family.name, family.type, family.documentation, samples))
    return answers, sorted(families)


def test_a_model_s_own_metrics_show_as_triton_shows_them(
    triton: PeerServer, appliance: Appliance
) -> None:
    theirs = probe_metrics(triton.urls["http"], triton.urls["metrics"])
    ours = probe_metrics(urls_of(appliance)["http"], urls_of(appliance)["http"])
    assert ours == theirs
    assert theirs[0] == [2.0, 7.0, 27.0]


def triton_families(metrics_url: str) -> dict[str, tuple[str, set[str], dict[str, float]]]:
    """Triton's metric families on /metrics: type, label names, add_sub's value (by
    failure reason); and the samples' names as written."""
    text = requests.get(f"http://{metrics_url}/metrics", timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(("nv_inference_", "nv_cpu_")) or not family.samples:
            continue
        labels = {name for sample in family.samples for name in sample.labels}
        add_sub = {
            sample.labels.get("reason", ""): sample.value
            for sample in family.samples
            if sample.labels.get("model") == "add_sub"
        }
        found[family.name] = (family.type, labels, add_sub)
    # The samples' names as written (the parser adds "_total" to a counter's).
    found["wire names"] = ("", wire_names(text), {})
    return found


def wire_names(text: str) -> set[str]:
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line.startswith(("nv_inference_", "nv_cpu_"))
    }


def add_sub_three_times(http_url: str) -> None:
    client = httpclient.InferenceServerClient(http_url)
    try:
        for _ in range(3):
            client.infer("add_sub", add_sub(httpclient, F4[:1], F4[:1]))
    finally:
        client.close()


def test_triton_s_metric_families_read_the_same_on_both(
    triton: PeerServer, appliance: Appliance
) -> None:
    ours_url = urls_of(appliance)["http"]
    before = {"triton": triton_families(triton.urls["metrics"]), "ours": triton_families(ours_url)}
    add_sub_three_times(triton.urls["http"])
    add_sub_three_times(ours_url)
    after = {"triton": triton_families(triton.urls["metrics"]), "ours": triton_families(ours_url)}
    theirs, ours = after["triton"], after["ours"]
    # The same families, of the same types, with the same label names.
    assert {n: (t, labels) for n, (t, labels, _) in ours.items()} == {
        n: (t, labels) for n, (t, labels, _) in theirs.items()
    }
    # The same traffic counted alike: requests, inferences, executions, no failure.
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        for server in ("triton", "ours"):
            grown = after[server][name][2][""] - before[server][name][2][""]
            assert grown == 3, (server, name, grown)
    assert ours["nv_inference_request_failure"][2] == theirs["nv_inference_request_failure"][2]


def test_each_instance_is_named_as_triton_names_it(
    triton: PeerServer, appliance: Appliance
) -> None:
    theirs = instance_names(triton.urls["http"])
    assert instance_names(urls_of(appliance)["http"]) == theirs == {"identify_0_0", "identify_0_1"}


# Triton's generate extension: (model, route, body, the words an error names).
GENERATE = [
    ("add_sub", "generate", {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}, ()),
    (
        "add_sub",
        "generate",
        {"id": "a1", "INPUT0": [1, 2, 3, 4], "parameters": {"INPUT1": [2] * 4}},
        (),
    ),
    ("square_stream", "generate_stream", {"IN": 3}, ()),
    ("square_stream", "generate", {"IN": 1}, ()),
    ("add_sub", "generate", {"INPUT0": [1, 2, 3], "INPUT1": [1, 1, 1, 1]}, ("INPUT0",)),
    ("nonesuch", "generate", {"X": 1.0}, ("nonesuch",)),
    ("identify", "generate", {"Y": 1.0}, ("X",)),
    ("identify", "generate", {"X": 1.0, "stop": [1]}, ("stop",)),
]


def generated(url: str, model: str, route: str, body: Any) -> tuple[int, str, Any]:
    """Status, content type and the JSON answer (a list of events for a stream)."""
    answer = requests.post(f"http://{url}/v2/models/{model}/{route}", json=body, timeout=30)
    kind = answer.headers.get("content-type", "").split(";")[0]
    if kind == "text/event-stream":
        lines = answer.text.split("\n")
        return (
            answer.status_code,
            kind,
            [json.loads(x[6:]) for x in lines if x.startswith("data: ")],
        )
    return answer.status_code, kind, answer.json()


def test_triton_s_generate_extension_answers_as_triton_does(
    triton: PeerServer, appliance: Appliance
) -> None:
    for model, route, body, words in GENERATE:
        theirs = generated(triton.urls["http"], model, route, body)
        ours = generated(urls_of(appliance)["http"], model, route, body)
        if not words:
            assert ours == theirs, (model, route, body)
            continue
        assert ours[:2] == theirs[:2], (model, body, theirs, ours)
        for word in words:
            assert word in theirs[2]["error"], theirs
            assert word in ours[2]["error"], ours
    # On purpose: Triton answers a model's several responses to generate with an error
    # in a 200 answer; the appliance says so with a 400.
    several = ("square_stream", "generate", {"IN": 3})
    theirs = generated(triton.urls["http"], *several)
    ours = generated(urls_of(appliance)["http"], *several)
    assert (theirs[0], "generate stream" in theirs[2]["error"]) == (200, True)
    assert (ours[0], "generate_stream" in ours[2]["error"]) == (400, True)
