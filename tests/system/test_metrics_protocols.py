"""/metrics counts model calls by protocol and model, added up over every process.

KServe REST and GRPS REST requests go through two HTTP workers (each on a
fresh connection, so both workers serve some), KServe gRPC and GRPS gRPC
through two gRPC processes, and MIP; whichever worker answers the scrape,
the totals are exact. The access log runs as JSON lines here, which also tells which
worker served what.
"""

from __future__ import annotations

import functools
import http.client
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from appliance._generated import grps_pb2, grps_pb2_grpc
from appliance.protocols.mip.client import MipClient, decode_item, tensor_item
from tests.system.harness import Appliance, demo_models, running
from tests.system.test_metrics import scrape, value

ROW = list(range(16))
SIMPLE_BODY = json.dumps(
    {
        "inputs": [
            {"name": name, "datatype": "INT32", "shape": [1, 16], "data": ROW}
            for name in ("INPUT0", "INPUT1")
        ]
    }
).encode()
GRPS_BODY = json.dumps(
    {
        "model": "simple",
        "gtensors": {
            "tensors": [
                {"name": name, "dtype": "DT_INT32", "shape": [1, 16], "flat_int32": ROW}
                for name in ("INPUT0", "INPUT1")
            ]
        },
    }
).encode()
FAIL_BODY = json.dumps(
    {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "parameters": {"fail": True},
    }
).encode()
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    models = [*demo_models("simple"), {"name": "slow", "class": "tests.models:Slow"}]
    with running(
        models,
        http={"workers": 2},
        grpc={"workers": 2},
        server={"access_log": "json"},
        mip={"listeners": [{"port": 0, "model": "simple"}]},
    ) as app:
        yield app


def post(app: Appliance, path: str, body: bytes) -> int:
    """POST on a fresh connection, so the kernel may hand it to either worker."""
    conn = http.client.HTTPConnection("127.0.0.1", app.ports["http"], timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def in_threads(count: int, call: Callable[[], Any], threads: int = 4) -> None:
    """Make ``count`` calls from a few threads at once; any failure fails the test."""
    errors: list[BaseException] = []
    shares = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]

    def run(share: int) -> None:
        try:
            for _ in range(share):
                call()
        except BaseException as ex:
            errors.append(ex)

    workers = [threading.Thread(target=run, args=(share,)) for share in shares]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not errors, errors


def access_lines(app: Appliance) -> list[dict[str, Any]]:
    lines = (line for line in app.log().splitlines() if line.startswith("{"))
    return [json.loads(line) for line in lines]


def http_worker_pids(app: Appliance) -> set[int]:
    return {int(p["pid"]) for p in app.processes() if p["role"] == "http worker"}


def kserve_rest_ok(app: Appliance) -> None:
    assert post(app, "/v2/models/simple/infer", SIMPLE_BODY) == 200


def kserve_rest_fails(app: Appliance) -> None:
    assert post(app, "/v2/models/slow/infer", FAIL_BODY) == 500


def grps_rest_ok(app: Appliance) -> None:
    assert post(app, "/grps/v1/infer/predict", GRPS_BODY) == 200


def kserve_grpc_ok(app: Appliance) -> None:
    # A channel per call, each with a connection of its own: they spread over
    # both gRPC processes (grpc shares connections between channels otherwise).
    with grpcclient.InferenceServerClient(
        f"127.0.0.1:{app.ports['grpc']}", channel_args=OWN_CONNECTION
    ) as client:
        tensors = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in tensors:
            tensor.set_data_from_numpy(np.array([ROW], dtype=np.int32))
        client.infer("simple", tensors, client_timeout=30)


def grps_grpc_ok(app: Appliance) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{app.ports['grpc']}", OWN_CONNECTION) as channel:
        request = grps_pb2.GrpsMessage(model="simple")
        for name in ("INPUT0", "INPUT1"):
            request.gtensors.tensors.add(
                name=name, dtype=grps_pb2.DT_INT32, shape=[1, 16], flat_int32=ROW
            )
        reply = grps_pb2_grpc.GrpsServiceStub(channel).Predict(request, timeout=30)
        assert reply.status.code == 200, reply.status.msg


def mip_ok(app: Appliance) -> None:
    row = np.array(ROW, dtype=np.int32)
    with MipClient("127.0.0.1", app.ports["mip"]) as mip:
        [[total, _difference]] = mip.infer([[tensor_item(row), tensor_item(row)]])
    assert decode_item(total).tolist() == (2 * row).tolist()


ROUND = {"kserve-rest": 20, "grps-rest": 12, "kserve-grpc": 8, "grps-grpc": 6, "mip": 5}
CALLS: dict[str, Callable[[Appliance], None]] = {
    "kserve-rest": kserve_rest_ok,
    "grps-rest": grps_rest_ok,
    "kserve-grpc": kserve_grpc_ok,
    "grps-grpc": grps_grpc_ok,
    "mip": mip_ok,
}


def servers(app: Appliance) -> tuple[set[int], set[str]]:
    """The HTTP worker pids and gRPC processes that have served model calls."""
    lines = [line for line in access_lines(app) if line["model"] == "simple"]
    http_pids = {line["pid"] for line in lines if line["role"] == "http-worker"}
    grpc_roles = {line["role"] for line in lines if line["role"].startswith("grpc[")}
    return http_pids, grpc_roles


def test_calls_are_counted_by_protocol_model_and_outcome_across_processes(
    appliance: Appliance,
) -> None:
    sent: Counter[str] = Counter()
    workers = http_worker_pids(appliance)
    assert len(workers) == 2  # ready means every HTTP worker has booted
    # Rounds on fresh connections, 4 at a time, until both HTTP workers and
    # both gRPC processes have served some.
    for _round in range(6):
        for protocol, count in ROUND.items():
            in_threads(count, functools.partial(CALLS[protocol], appliance))
            sent[protocol] += count
        if servers(appliance) == (workers, {"grpc[0]", "grpc[1]"}):
            break
    assert servers(appliance) == (workers, {"grpc[0]", "grpc[1]"})
    in_threads(3, lambda: kserve_rest_fails(appliance), threads=1)

    kserve_calls = sent["kserve-rest"] + sent["kserve-grpc"]
    grps_calls = sent["grps-rest"] + sent["grps-grpc"]
    # Every scrape, whichever HTTP worker answers it, adds up every process.
    for _ in range(4):
        samples = scrape(appliance)
        requests = "appliance_model_requests_total"
        assert value(samples, requests, protocol="kserve", model="simple") == kserve_calls
        assert value(samples, requests, protocol="kserve", model="simple", outcome="ok") == (
            kserve_calls
        )
        assert value(samples, requests, protocol="grps", model="simple", outcome="ok") == (
            grps_calls
        )
        assert (
            value(samples, requests, protocol="kserve", model="slow", outcome="model_failed") == 3
        )
        assert value(samples, requests, protocol="mip", model="simple") == sent["mip"]
        assert value(samples, requests, model="simple") == kserve_calls + grps_calls + sent["mip"]
        latency = "appliance_model_request_duration_seconds_count"
        assert value(samples, latency, protocol="kserve", model="simple") == kserve_calls
        assert value(samples, latency, protocol="grps", model="simple") == grps_calls
        frontend = "appliance_frontend_requests_total"
        assert value(samples, frontend, protocol="kserve", status="200") == sent["kserve-rest"]
        assert value(samples, frontend, protocol="kserve", status="500") == 3
        assert value(samples, frontend, protocol="kserve", status="OK") == sent["kserve-grpc"]
        assert value(samples, frontend, protocol="grps", status="200") == sent["grps-rest"]
        assert value(samples, frontend, protocol="grps", status="OK") == sent["grps-grpc"]
        assert value(samples, frontend, protocol="mip", status="OK") == sent["mip"]
        assert value(samples, "appliance_model_requests_total", protocol="internal") == 0
    # The worker side agrees: every call reached one of simple's batches.
    rows = kserve_calls + grps_calls + sent["mip"]
    assert value(samples, "appliance_batch_rows_sum", model="simple") == rows


def test_access_log_json_lines_name_protocol_model_status_and_latency(
    appliance: Appliance,
) -> None:
    kserve_rest_ok(appliance)
    kserve_grpc_ok(appliance)
    mip_ok(appliance)
    kserve_rest_fails(appliance)
    lines = access_lines(appliance)
    rest = [line for line in lines if line.get("request") == "POST /v2/models/simple/infer"]
    grpc_lines = [line for line in lines if line.get("request", "").endswith("/ModelInfer")]
    assert rest
    assert grpc_lines
    for line in (rest[-1], grpc_lines[-1]):
        assert line["protocol"] == "kserve"
        assert line["model"] == "simple"
        assert line["latency_ms"] >= 0
        assert line["time"].endswith("Z")
    assert rest[-1]["status"] == "200"
    assert rest[-1]["role"] == "http-worker"
    assert grpc_lines[-1]["status"] == "OK"
    assert grpc_lines[-1]["role"].startswith("grpc[")
    mip = [line for line in lines if line["protocol"] == "mip"]
    assert mip[-1]["model"] == "simple"
    assert mip[-1]["status"] == "OK"
    assert mip[-1]["role"] == "mip[0]"
    failed = [line for line in lines if line.get("request") == "POST /v2/models/slow/infer"]
    assert failed[-1]["status"] == "500"
    assert failed[-1]["model"] == "slow"
