"""One TorchServe model store served by real TorchServe 0.12 and by the appliance, call by call.

The store (tests/torchserve_models.py, written fresh into tmp: a module-level
``handle``, a handler that shows what it was given, a class handler with an
extra file and its own statuses and headers, handlers that fail in each way
TorchServe answers, a batch-4 handler and a streaming one) is served
unchanged by TorchServe (bench/.peers/torchserve, with CPU torch) and by
``appliance serve --model-store``. The same HTTP calls go to both: statuses
and bodies must be equal, and what a handler saw of each request too.

Where the appliance answers otherwise on purpose, ``ON_PURPOSE`` says why
(docs/models/torchserve.md lists the same).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from bench.servers import PeerServer, PeerUnavailable
from bench.torchserve_peer import torchserve
from tests.system.harness import Appliance
from tests.system.model_store import serving_model_store
from tests.torch_archives import write_digits_mar, write_script_mar
from tests.torchserve_models import (
    BATCH_CONFIG,
    BATCH_HANDLER,
    ECHO_HANDLER,
    INSPECT_HANDLER,
    LABELS,
    LABELS_HANDLER,
    METRICS_HANDLER,
    RAISING_HANDLER,
    STREAM_HANDLER,
    WRONG_LENGTH_HANDLER,
    digit_png,
    write_mar,
    write_model_dir,
)

pytestmark = pytest.mark.peers

TIMEOUT = 60
# Call name -> why the appliance's answer differs from TorchServe's.
ON_PURPOSE = {
    "labels status": "a handler's reason phrase is not sent (uvicorn sends the status's own)",
}


@dataclass(frozen=True)
class Call:
    name: str
    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)


CALLS = [
    Call("ping", "GET", "/ping"),
    Call("json", "POST", "/predictions/echo", {"json": {"a": [1, 2], "b": "x"}}),
    Call(
        "text",
        "POST",
        "/predictions/echo",
        {"data": "héllo".encode(), "headers": {"Content-Type": "text/plain; charset=utf-8"}},
    ),
    Call("bytes", "POST", "/predictions/echo", {"data": bytes(range(256))}),
    Call("put", "PUT", "/predictions/echo", {"data": b"uploaded"}),
    Call("version", "POST", "/predictions/echo/1.0", {"data": b"v"}),
    Call("wrong version", "POST", "/predictions/echo/9.9", {"data": b"v"}),
    Call("unknown model", "POST", "/predictions/nope", {"data": b"v"}),
    Call("labels", "POST", "/predictions/labels", {"data": b"1"}),
    Call(
        "labels status",
        "POST",
        "/predictions/labels",
        {"data": b"2", "headers": {"x-want-status": "201"}},
    ),
    Call("wrong length", "POST", "/predictions/wrong", {"data": b"1"}),
    Call("raises", "POST", "/predictions/raising", {"data": b"1"}),
    Call(
        "prediction exception",
        "POST",
        "/predictions/raising",
        {"data": b"1", "headers": {"x-raise": "prediction"}},
    ),
    Call("custom metrics", "POST", "/predictions/metrics", {"data": b"1"}),
    Call("invocations", "POST", "/invocations?model_name=echo", {"data": b"legacy"}),
    Call("invoke", "POST", "/models/echo/invoke?k=v", {"data": b"legacy"}),
    Call("legacy predict", "POST", "/echo/predict", {"data": b"legacy"}),
    Call("legacy form", "POST", "/echo/predict?k=v", {"data": {"f": "1"}}),
    Call("torchscript", "POST", "/predictions/scripted", {"json": [1.0, 2.0, 3.0]}),
    # The mnist example's network: a PNG as the body (curl -T), as a form's file field.
    Call("mnist body", "PUT", "/predictions/digits", {"data": digit_png()}),
    Call("mnist form", "POST", "/predictions/digits", {"files": {"data": ("0.png", digit_png())}}),
    # BaseHandler without get_insights: its explain path fails (a 503 on both).
    Call("mnist explanations", "POST", "/explanations/digits", {"data": digit_png()}),
    Call("list", "GET", "/models", {"management": True}),
    Call("list page", "GET", "/models?limit=2", {"management": True}),
    Call("describe unknown", "GET", "/models/nope", {"management": True}),
]


@dataclass
class Served:
    torchserve: PeerServer
    appliance: Appliance
    ports: dict[str, int]

    def url(self, server: str, path: str, management: bool) -> str:
        if server == "torchserve":
            base = self.torchserve.urls["management" if management else "inference"]
        else:
            port = self.ports["management" if management else "http"]
            base = f"http://127.0.0.1:{port}"
        return base + path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    store = tmp_path_factory.mktemp("model-store")
    write_mar(store, "echo", ECHO_HANDLER)
    write_mar(store, "inspect", INSPECT_HANDLER)
    write_model_dir(
        store, "labels", LABELS_HANDLER, extra_files={"labels.json": json.dumps(LABELS)}
    )
    write_mar(store, "wrong", WRONG_LENGTH_HANDLER)
    write_mar(store, "raising", RAISING_HANDLER)
    write_mar(store, "batch", BATCH_HANDLER, config_yaml=BATCH_CONFIG)
    write_mar(store, "stream", STREAM_HANDLER)
    write_mar(store, "metrics", METRICS_HANDLER)
    write_script_mar(store, tmp_path_factory.mktemp("scripted"))
    write_digits_mar(store, tmp_path_factory.mktemp("digits"))
    # Not served at the start: registered through the management API.
    write_mar(store, "later", ECHO_HANDLER, version="3.1")
    models = ["echo.mar", "inspect.mar", "labels", "wrong.mar", "raising.mar", "batch.mar"]
    models += ["stream.mar", "metrics.mar", "scripted.mar", "digits.mar"]
    try:
        # Prometheus names on /metrics, as a TorchServe user who scrapes it sets, and
        # every metric a handler records (the appliance exports them all).
        properties = {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"}
        peer = torchserve(store, models, properties)
        real = peer.__enter__()
    except PeerUnavailable as ex:
        pytest.skip(f"real TorchServe is not available here: {ex}")
    try:
        with serving_model_store(store, models) as appliance:
            yield Served(real, appliance, appliance.ports)
    finally:
        peer.__exit__(None, None, None)


def _answer(served: Served, server: str, call: Call) -> tuple[int, bytes]:
    kwargs = dict(call.kwargs)
    management = kwargs.pop("management", False)
    url = served.url(server, call.path, management)
    answer = requests.request(call.method, url, timeout=TIMEOUT, **kwargs)
    return answer.status_code, answer.content


@pytest.mark.parametrize("call", CALLS, ids=lambda call: call.name)
def test_each_call_answers_as_torchserve_s(served: Served, call: Call) -> None:
    theirs = _answer(served, "torchserve", call)
    ours = _answer(served, "appliance", call)
    if call.name in ON_PURPOSE:
        assert ours[0] == theirs[0], ON_PURPOSE[call.name]
        return
    assert ours == theirs


def test_a_handler_sees_each_request_as_torchserve_s_does(served: Served) -> None:
    def seen(server: str, headers: dict[str, str], **kwargs: Any) -> dict[str, Any]:
        url = served.url(server, "/predictions/inspect/1.0/extra/path", False)
        sent = {"X-Tag": "t1", **headers}
        answer = requests.post(url, timeout=TIMEOUT, headers=sent, **kwargs)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = answer.json()
        return found

    for kwargs in (
        {"json": {"x": 1}},
        {"data": b"raw"},
        {"data": b"plain text", "headers": {"Content-Type": "text/plain"}},
        {"files": {"data": ("a.json", b'{"y": 2}', "application/json")}, "data": {"k": "v"}},
    ):
        headers = kwargs.pop("headers", {})
        theirs = seen("torchserve", headers, **kwargs)
        ours = seen("appliance", headers, **kwargs)
        assert ours["fields"] == theirs["fields"]
        assert ours["batch"] == theirs["batch"] == 1
        # Headers: the same names (in any case) and values, TorchServe's own among them.
        lowered = {k.lower(): v for k, v in theirs["headers"].items()}
        mine = {k.lower(): v for k, v in ours["headers"].items()}
        for name in ("x-tag", "url_path", "explain"):
            assert mine.get(name) == lowered.get(name), name
        # (a form's boundary is the client's own, new each time)
        media = str(lowered.get("content-type")).split(";")[0]
        assert str(mine.get("content-type")).split(";")[0] == media


def test_four_concurrent_requests_make_one_batch_on_both(served: Served) -> None:
    for server in ("torchserve", "appliance"):
        url = served.url(server, "/predictions/batch", False)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(_post_to(url), range(4)))
        assert all(answer.json()["batch_size"] == 4 for answer in answers), server


def test_a_torchscript_batch_answers_the_same_on_both(served: Served) -> None:
    rows = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    answers = {}
    for server in ("torchserve", "appliance"):
        url = served.url(server, "/predictions/scripted", False)
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(functools.partial(_post_json, url), rows))
        answers[server] = [reply.json()["y"] for reply in replies]
    assert answers["appliance"] == answers["torchserve"]


def _post_json(url: str, row: Any) -> Any:
    return requests.post(url, json=row, timeout=TIMEOUT)


def _post_to(url: str) -> Any:
    return lambda _: requests.post(url, data=b"x", timeout=TIMEOUT)


def test_a_streamed_answer_arrives_in_the_same_chunks(served: Served) -> None:
    bodies = {}
    for server in ("torchserve", "appliance"):
        url = served.url(server, "/predictions/stream", False)
        with requests.post(url, data=b"x", stream=True, timeout=TIMEOUT) as answer:
            assert answer.status_code == 200
            assert answer.headers.get("transfer-encoding") == "chunked"
            bodies[server] = b"".join(answer.iter_content(chunk_size=None))
    assert bodies["appliance"] == bodies["torchserve"]


FAMILIES = (
    "ts_inference_requests_total",
    "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds",
)


def _samples(text: str, name: str) -> dict[str, float]:
    """``name``'s samples by their label text."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) :].rpartition(" ")
            found[labels] = float(value)
    return found


def test_torchserve_s_metric_families_count_the_same_requests(served: Served) -> None:
    def scrape(server: str) -> str:
        if server == "torchserve":
            url = served.torchserve.urls["metrics"] + "/metrics"
        else:
            url = f"http://127.0.0.1:{served.ports['metrics']}/metrics"
        return requests.get(url, timeout=TIMEOUT).text

    before = {server: scrape(server) for server in ("torchserve", "appliance")}
    for server in ("torchserve", "appliance"):
        for _ in range(3):
            url = served.url(server, "/predictions/echo", False)
            assert requests.post(url, data=b"m", timeout=TIMEOUT).status_code == 200
    after = {server: scrape(server) for server in ("torchserve", "appliance")}
    for name in (*FAMILIES, "Requests2XX", "Requests4XX", "Requests5XX"):
        for server in ("torchserve", "appliance"):
            assert f"# TYPE {name} counter" in after[server], (server, name)
    label = '{model_name="echo",model_version="default",hostname="%s",}'
    for server in ("torchserve", "appliance"):
        counts = _samples(after[server], FAMILIES[0])
        [key] = [
            key for key in counts if key.startswith('{model_name="echo",model_version="default"')
        ]
        assert key == label % key.split('hostname="')[1].split('"')[0]
        was = _samples(before[server], FAMILIES[0]).get(key, 0.0)
        assert counts[key] - was == 3.0, server


# The metrics model's (tests/torchserve_models.py): name -> whether its values are the handler's.
HANDLER_METRICS = {
    "InitializeCallCount": True,
    "HandleCallCount": False,  # counts the calls of every test to the model
    "RowsSeen": False,
    "HandlerTime": True,
    "BodySize": True,
    "PredictionTime": False,  # a time
    "SomePercent": False,
}


def test_a_handler_s_own_metrics_are_exported_as_torchserve_exports_them(served: Served) -> None:
    def scrape(server: str) -> dict[str, list[str]]:
        if server == "torchserve":
            url = served.torchserve.urls["metrics"] + "/metrics"
        else:
            url = f"http://127.0.0.1:{served.ports['metrics']}/metrics"
        text = requests.get(url, timeout=TIMEOUT).text
        found: dict[str, list[str]] = {}
        for line in text.splitlines():
            for name in HANDLER_METRICS:
                if line.split(" ", 3)[2:3] == [name] or line.split("{")[0].startswith(name):
                    found.setdefault(name, []).append(line)
        return found

    for server in ("torchserve", "appliance"):
        for _ in range(2):
            url = served.url(server, "/predictions/metrics", False)
            assert requests.post(url, data=b"1", timeout=TIMEOUT).status_code == 200
    theirs, ours = scrape("torchserve"), scrape("appliance")
    for name, same_values in HANDLER_METRICS.items():
        # The HELP and TYPE lines, each series' name and labels in order, and the
        # handler's own values.
        # (in any order: each server lists series as they came).
        assert sorted(line.rsplit(" ", 1)[0] for line in ours.get(name, [])) == sorted(
            line.rsplit(" ", 1)[0] for line in theirs.get(name, [])
        ), name
        if same_values:
            mine = [line for line in ours[name] if 'ModelName="metrics"' in line]
            assert mine == [line for line in theirs[name] if 'ModelName="metrics"' in line], name


def _manage(served: Served, server: str, method: str, path: str) -> tuple[int, Any]:
    answer = requests.request(method, served.url(server, path, True), timeout=120)
    return answer.status_code, answer.json()


def _shape(value: Any) -> Any:
    """A JSON value's keys and types, without its values (pids, times, sizes)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value[:1]]
    return type(value).__name__


def test_management_registers_scales_describes_and_unregisters_as_torchserve(
    served: Served,
) -> None:
    steps = [
        ("POST", "/models?url=later.mar&initial_workers=1&synchronous=true"),
        ("POST", "/models?url=later.mar&initial_workers=1&synchronous=true"),
        ("POST", "/models?url=missing.mar"),
        ("POST", "/models"),
        ("PUT", "/models/later?min_worker=2&synchronous=true"),
        ("PUT", "/models/later/3.1/set-default"),
        ("PUT", "/models/later/9.9/set-default"),
        ("GET", "/models/nope"),
        ("PUT", "/models/nope?min_worker=1"),
    ]
    for method, path in steps:
        theirs = _manage(served, "torchserve", method, path)
        ours = _manage(served, "appliance", method, path)
        assert ours == theirs, (method, path)
    described = {
        server: _manage(served, server, "GET", "/models/later")[1][0]
        for server in ("torchserve", "appliance")
    }
    assert _shape(described["appliance"]) == _shape(described["torchserve"])
    for key in ("modelName", "modelVersion", "modelUrl", "minWorkers", "maxWorkers", "batchSize"):
        assert described["appliance"][key] == described["torchserve"][key], key
    ready = [[w["status"] for w in d["workers"]] for d in described.values()]
    assert ready == [["READY", "READY"], ["READY", "READY"]]
    for server in ("torchserve", "appliance"):
        url = served.url(server, "/predictions/later", False)
        assert requests.post(url, data=b"r", timeout=TIMEOUT).content == b"r"
    gone = {s: _manage(served, s, "DELETE", "/models/later") for s in ("torchserve", "appliance")}
    assert gone["appliance"] == gone["torchserve"]
