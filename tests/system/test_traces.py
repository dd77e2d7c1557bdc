"""Traces of requests across processes, received by a real OTLP/HTTP endpoint in this test.

The receiver is a plain HTTP server in the test process that decodes what
the appliance's OpenTelemetry exporters post (OTLP's protobuf, parsed with
opentelemetry-proto) into spans. The appliance traces every request (level
TIMESTAMPS, rate 1, set through Triton's trace extension). One request per
protocol goes through; each must arrive as one tree: the frontend's server
span (the caller's child where it sent a W3C traceparent) over decode,
infer and encode, and under infer, from the model worker's process, queue,
compute and reply; compute links to its batch's span, which links back.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.system.harness import Appliance, demo_models, make_config, new_run_dir, serving
from tests.system.protocol_load import CLIENTS, SECTIONS, scaled

# The receiver decodes OTLP with opentelemetry-proto; the appliance exports with
# the traces extra (make installs both).
trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="opentelemetry-proto is not installed (the dev extra)",
)
pytest.importorskip("opentelemetry.sdk", reason="the traces extra is not installed")

# graphpipe's client calls flatbuffers' deprecated EndVector(n).
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
WORKER_SPANS = ("queue", "compute", "reply")


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it was sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.take(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def take(self, body: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        found = []
        for resource in request.resource_spans:
            pid = next(
                (a.value.int_value for a in resource.resource.attributes if a.key == "process.pid"),
                0,
            )
            for scope in resource.scope_spans:
                for span in scope.spans:
                    found.append(
                        {
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "links": [link.span_id.hex() for link in span.links],
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "pid": pid,
                        }
                    )
        with self.lock:
            self.spans += found

    def trees(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def otlp_receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


@pytest.fixture(scope="module")
def receiver(appliance: Appliance, otlp_receiver: Receiver) -> Receiver:
    """The receiver, with tracing on in the appliance (as the first test turns it on):
    each test that reads spans passes alone too."""
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        before = rest.get_trace_settings()
        rest.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    finally:
        rest.close()
    if before["trace_level"] != ["TIMESTAMPS"] or before["trace_rate"] != "1":
        time.sleep(1.2)  # every process reads the settings again within a second
    return otlp_receiver


# Two steps: simple's two outputs, sum and difference, are the second's two inputs.
TWICE = {
    "name": "simple_twice",
    "platform": "ensemble",
    "inputs": [{"name": n, "dtype": "INT32", "shape": [-1, 16]} for n in ("A", "B")],
    "outputs": [{"name": "OUT", "dtype": "INT32", "shape": [-1, 16]}],
    "steps": [
        {
            "model": "simple",
            "input_map": {"INPUT0": "A", "INPUT1": "B"},
            "output_map": {"OUTPUT0": "sum", "OUTPUT1": "difference"},
        },
        {
            "model": "simple",
            "input_map": {"INPUT0": "sum", "INPUT1": "difference"},
            "output_map": {"OUTPUT0": "OUT"},
        },
    ],
}


@pytest.fixture(scope="module")
def appliance(otlp_receiver: Receiver) -> Iterator[Appliance]:
    models = [*demo_models("simple", "repeat_int32"), scaled(2.0, delay_s=0.0), TWICE]
    config = make_config(new_run_dir(), models, **SECTIONS)
    config["traces"] = {"url": otlp_receiver.url, "export_ms": 100}
    with serving(config) as started:
        yield started


def wait_for(receiver: Receiver, trace: str, names: set[str], timeout_s: float = 20.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spans = [s for s in receiver.trees() if s["trace"] == trace]
        if names <= {s["name"] for s in spans}:
            return spans
        time.sleep(0.1)
    got = sorted({s["name"] for s in receiver.trees() if s["trace"] == trace})
    raise AssertionError(f"trace {trace}: spans {got}, wanted {sorted(names)}")


def test_the_trace_extension_turns_tracing_on_and_reads_back(appliance: Appliance) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        before = rest.get_trace_settings()
        after = rest.update_trace_settings(
            settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
        )
        model = grpc.update_trace_settings("simple", {"trace_count": "-1"}, as_json=True)
        with pytest.raises(Exception, match="trace_rate: expected a whole number >= 1"):
            rest.update_trace_settings(settings={"trace_rate": "0"})
    finally:
        rest.close()
        grpc.close()
    assert before["trace_level"] == ["OFF"]
    assert before["trace_mode"] == "opentelemetry"
    assert after["trace_level"] == ["TIMESTAMPS"]
    assert after["trace_rate"] == "1"
    assert model["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
    time.sleep(1.2)  # every process reads the settings again within a second


def test_kserve_rest_follows_the_callers_trace_into_the_model_worker(
    appliance: Appliance, receiver: Receiver
) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        client.infer("simple", inputs, headers={"traceparent": TRACEPARENT})
    finally:
        client.close()
    spans = wait_for(receiver, CALLER_TRACE, {"kserve simple", *WORKER_SPANS, "infer"})
    by_name = {s["name"]: s for s in spans}
    server, infer = by_name["kserve simple"], by_name["infer"]
    assert server["parent"] == CALLER_SPAN
    assert infer["parent"] == server["id"]
    assert by_name["decode"]["parent"] == server["id"]
    for name in WORKER_SPANS:
        assert by_name[name]["parent"] == infer["id"], name
        assert by_name[name]["pid"] != server["pid"], f"{name} is not the model worker's"
    assert server["start"] <= infer["start"] <= by_name["queue"]["start"]
    batch = next(s for s in receiver.trees() if s["id"] in by_name["compute"]["links"])
    assert batch["name"] == "batch simple"
    assert by_name["compute"]["id"] in batch["links"] or infer["id"] in batch["links"]


def test_a_stream_is_one_infer_span_under_the_request(
    appliance: Appliance, receiver: Receiver
) -> None:
    """A streamed call (MLServer's infer_stream: server-sent events) is traced as a unary
    one is: its ``infer`` span under the request's, the worker's spans under it."""
    trace = "4bf92f3577b34da6a3ce929d0e0e4737"
    body = {
        "inputs": [
            {"name": "IN", "datatype": "INT32", "shape": [3], "data": [4, 5, 6]},
            {"name": "DELAY", "datatype": "UINT32", "shape": [3], "data": [0, 0, 0]},
            {"name": "WAIT", "datatype": "UINT32", "shape": [1], "data": [0]},
        ]
    }
    answer = requests.post(
        f"http://127.0.0.1:{appliance.ports['http']}/v2/models/repeat_int32/infer_stream",
        json=body,
        headers={"traceparent": f"00-{trace}-{CALLER_SPAN}-01"},
        timeout=30,
    )
    assert answer.status_code == 200
    assert answer.text.count("data: ") == 3
    spans = wait_for(receiver, trace, {"kserve repeat_int32", "infer"})
    by_name = {s["name"]: s for s in spans}
    server, infer = by_name["kserve repeat_int32"], by_name["infer"]
    assert server["parent"] == CALLER_SPAN
    assert infer["parent"] == server["id"]
    for span in spans:
        if span["name"] in WORKER_SPANS:
            assert span["parent"] == infer["id"], span["name"]
            assert span["pid"] != server["pid"]


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        f"00-{'z' * 32}-{CALLER_SPAN}-01",  # not hex
        f"00-{'0' * 32}-{CALLER_SPAN}-01",  # an all-zero trace id is invalid
        f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01",  # a forbidden version
        "00-" + "a" * 4000 + "-01",
    ],
)
def test_a_hostile_traceparent_is_ignored_and_the_call_answered(
    appliance: Appliance, traceparent: str
) -> None:
    before = {p["pid"] for p in appliance.processes()}
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        for client, module in ((rest, httpclient), (grpc, grpcclient)):
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
            result = client.infer("simple", inputs, headers={"traceparent": traceparent})
            assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
    finally:
        rest.close()
        grpc.close()
    # No process of the tree died of it.
    assert {p["pid"] for p in appliance.processes()} == before


def _new_trace(receiver: Receiver, server_name: str, seen: set[str]) -> list[dict[str, Any]]:
    """The spans of a trace not in ``seen`` whose server span is ``server_name``, once whole."""
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        spans = receiver.trees()
        for server in (s for s in spans if s["name"] == server_name and s["trace"] not in seen):
            mine = [s for s in spans if s["trace"] == server["trace"]]
            if {"infer", "encode", *WORKER_SPANS} <= {s["name"] for s in mine}:
                return mine
        time.sleep(0.1)
    raise AssertionError(f"no whole new trace under {server_name!r}")


@pytest.mark.parametrize("protocol", list(CLIENTS))
def test_every_protocol_is_traced_across_the_process_boundary(
    appliance: Appliance, receiver: Receiver, protocol: str
) -> None:
    seen = {s["trace"] for s in receiver.trees()}
    call, close = CLIENTS[protocol](appliance, "scaled")
    try:
        call(np.array([[1, 2, 3, 4]], np.float32))
    finally:
        close()
    label = protocol.split("-")[0]
    spans = _new_trace(receiver, f"{label} scaled", seen)
    server = next(s for s in spans if s["name"] == f"{label} scaled")
    infer = next(s for s in spans if s["name"] == "infer")
    assert infer["parent"] == server["id"]
    assert {s["parent"] for s in spans if s["name"] in ("decode", "encode")} == {server["id"]}
    workers = [s for s in spans if s["name"] in WORKER_SPANS]
    assert {s["parent"] for s in workers} == {infer["id"]}
    assert server["pid"] not in {s["pid"] for s in workers}


def test_an_ensemble_call_has_a_span_per_step_with_its_workers_spans_under_it(
    appliance: Appliance, receiver: Receiver
) -> None:
    trace = "1f2e3d4c5b6a79881f2e3d4c5b6a7988"
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("A", "B")]
        inputs[0].set_data_from_numpy(np.full((1, 16), 5, np.int32))
        inputs[1].set_data_from_numpy(np.full((1, 16), 3, np.int32))
        headers = {"traceparent": f"00-{trace}-{CALLER_SPAN}-01"}
        result = client.infer("simple_twice", inputs, headers=headers)
    finally:
        client.close()
    assert result.as_numpy("OUT").tolist() == [[10] * 16]  # (5 + 3) + (5 - 3)
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        spans = [s for s in receiver.trees() if s["trace"] == trace]
        if sum(s["name"] == "reply" for s in spans) == 2 and any(
            s["name"] == "encode" for s in spans
        ):
            break
        time.sleep(0.1)
    server = next(s for s in spans if s["name"] == "kserve simple_twice")
    assert server["parent"] == CALLER_SPAN
    call = next(s for s in spans if s["name"] == "infer" and s["parent"] == server["id"])
    steps = sorted(
        (s for s in spans if s["name"] == "infer" and s["parent"] == call["id"]),
        key=lambda s: s["start"],
    )
    assert len(steps) == 2, spans
    # The second step starts once the first answered; both inside the ensemble's span.
    assert call["start"] <= steps[0]["start"] <= steps[0]["end"] <= steps[1]["start"]
    assert steps[1]["end"] <= call["end"]
    for step in steps:
        mine = {s["name"]: s for s in spans if s["parent"] == step["id"]}
        assert set(WORKER_SPANS) <= set(mine), (step, sorted(mine))
        assert {mine[name]["pid"] for name in WORKER_SPANS} != {server["pid"]}
