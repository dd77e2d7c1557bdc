"""GRPS over gRPC against a real appliance: GrpsService stubs built from our grps.proto.

The stubs are generated from protos/grps.proto, which is wire-compatible with
GRPS's published grps.proto (same package, messages, field numbers), so this
is what a GRPS client sees.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests
import yaml

from appliance._generated import grps_pb2, grps_pb2_grpc, health_pb2, health_pb2_grpc
from appliance.client.api import ModelClient
from tests.system.harness import Appliance, demo_models, eventually, running

MODELS = ("simple", "forward", "echo")
SUCCESS = grps_pb2.Status.SUCCESS
FAILURE = grps_pb2.Status.FAILURE


@pytest.fixture(scope="module")
def grps() -> Iterator[Appliance]:
    with running(demo_models(*MODELS), server={"default_model": "echo"}) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def channel(grps: Appliance) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{grps.ports['grpc']}") as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> Any:
    return grps_pb2_grpc.GrpsServiceStub(channel)


@pytest.fixture(scope="module")
def client(grps: Appliance) -> ModelClient:
    return grps.client()


def ok(reply: Any) -> Any:
    assert reply.status.status == SUCCESS, reply.status.msg
    assert (reply.status.code, reply.status.msg) == (200, "OK")
    return reply


def failed(reply: Any, code: int, *words: str) -> None:
    assert reply.status.status == FAILURE
    assert reply.status.code == code, reply.status.msg
    for word in words:
        assert word in reply.status.msg


def msg(**fields: Any) -> Any:
    return grps_pb2.GrpsMessage(**fields)


# -- health and metadata -----------------------------------------------------------


def test_liveness_readiness_and_metadata(stub: Any) -> None:
    ok(stub.CheckLiveness(msg(), timeout=10))
    ok(stub.CheckReadiness(msg(), timeout=10))
    server = yaml.safe_load(ok(stub.ServerMetadata(msg(), timeout=10)).str_data)
    assert [m["name"] for m in server["models"]] == list(MODELS)
    simple = yaml.safe_load(ok(stub.ModelMetadata(msg(str_data="simple"), timeout=10)).str_data)
    assert simple["outputs"][1]["name"] == "OUTPUT1"
    failed(stub.ModelMetadata(msg(), timeout=10), 400, "No model name")
    failed(stub.ModelMetadata(msg(str_data="nope"), timeout=10), 404, "nope")


def test_offline_over_grpc_drains_every_protocol(
    grps: Appliance, stub: Any, channel: grpc.Channel
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    kserve_ready = f"http://127.0.0.1:{grps.ports['http']}/v2/health/ready"
    try:
        ok(stub.Offline(msg(), timeout=10))
        failed(stub.CheckReadiness(msg(), timeout=10), 503, "Service Unavailable")
        ok(stub.CheckLiveness(msg(), timeout=10))
        assert requests.get(kserve_ready, timeout=10).status_code == 503
        grpc_health = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert grpc_health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert ok(stub.Predict(msg(str_data="served"), timeout=10)).str_data == "served"
    finally:
        ok(stub.Online(msg(), timeout=10))
    ok(stub.CheckReadiness(msg(), timeout=10))
    assert eventually(lambda: requests.get(kserve_ready, timeout=10).status_code == 200, 2.0)


# -- predict -----------------------------------------------------------------------


def test_the_calls_of_grps_example_grpc_client(stub: Any) -> None:
    """The calls GRPS's template client (client/python/grpc_client.py) makes, in order."""
    ok(stub.CheckLiveness(msg()))
    ok(stub.Online(msg()))
    ok(stub.CheckReadiness(msg()))
    assert ok(stub.Predict(msg(str_data="hello grps."))).str_data == "hello grps."
    request = msg()
    request.gtensors.tensors.append(
        grps_pb2.GenericTensor(
            name="inp", dtype=grps_pb2.DT_FLOAT32, shape=[2, 3], flat_float32=[1, 2, 3, 4, 5, 6]
        )
    )
    assert ok(stub.Predict(request)).gtensors == request.gtensors
    assert ok(stub.Predict(msg(bin_data=b"hello grps."))).bin_data == b"hello grps."
    request = msg()
    request.gmap.s_s["key"] = "hello grps."
    request.gmap.s_b["key"] = b"hello grps."
    request.gmap.s_i32["key"] = 1
    request.gmap.s_i64["key"] = 1
    request.gmap.s_f["key"] = 1.0
    request.gmap.s_d["key"] = 1.0
    assert ok(stub.Predict(request)).gmap == request.gmap
    parts = [ok(part).str_data for part in stub.PredictStreaming(msg(str_data="hello grps."))]
    assert "".join(parts) == "hello grps."
    assert yaml.safe_load(ok(stub.ServerMetadata(msg())).str_data)
    failed(stub.ModelMetadata(msg(str_data="your_model")), 404, "your_model")
    try:
        ok(stub.Offline(msg()))
        failed(stub.CheckReadiness(msg()), 503)
    finally:
        ok(stub.Online(msg()))


def test_predict_every_payload_kind(stub: Any) -> None:
    assert ok(stub.Predict(msg(str_data="hi"), timeout=10)).str_data == "hi"
    assert ok(stub.Predict(msg(bin_data=b"\x00\xff"), timeout=10)).bin_data == b"\x00\xff"
    request = msg(model="simple-1")
    request.gtensors.tensors.add(dtype=grps_pb2.DT_INT32, shape=[1, 16], flat_int32=range(16))
    request.gtensors.tensors.add(dtype=grps_pb2.DT_INT32, shape=[1, 16], flat_int32=[2] * 16)
    reply = ok(stub.Predict(request, timeout=10))
    sums, differences = reply.gtensors.tensors
    assert (sums.name, list(sums.shape)) == ("OUTPUT0", [1, 16])
    assert list(sums.flat_int32) == [x + 2 for x in range(16)]
    assert list(differences.flat_int32) == [x - 2 for x in range(16)]
    gmap = msg()
    gmap.gmap.s_b["raw"] = b"\xff\x00"
    gmap.gmap.s_s["text"] = "héllo"
    gmap.gmap.s_i64["n"] = 1 << 40
    gmap.gmap.s_d["d"] = 0.1
    assert ok(stub.Predict(gmap, timeout=10)).gmap == gmap.gmap
    many = msg()
    many.gtensors.tensors.add(name="s", dtype=grps_pb2.DT_STRING, shape=[2], flat_string=["a", "b"])
    many.gtensors.tensors.add(name="h", dtype=grps_pb2.DT_FLOAT16, shape=[1], flat_float16=[0.5])
    assert ok(stub.Predict(many, timeout=10)).gtensors == many.gtensors


def test_predict_errors_live_in_the_status(stub: Any) -> None:
    failed(stub.Predict(msg(model="nope", str_data="x"), timeout=10), 404, "'nope'")
    failed(stub.Predict(msg(), timeout=10), 400, "no data")
    failed(stub.Predict(msg(model="simple", str_data="x"), timeout=10), 400, "send gtensors")
    ndarray = msg(model="forward")
    ndarray.ndarray.SetInParent()
    failed(stub.Predict(ndarray, timeout=10), 400, "only in HTTP JSON")
    wrong = msg(model="forward")
    wrong.gtensors.tensors.add(name="x", dtype=grps_pb2.DT_FLOAT32, shape=[1, 1], flat_float32=[1])
    failed(stub.Predict(wrong, timeout=10), 400, "expected datatype FP64")
    short = msg()
    short.gtensors.tensors.add(dtype=grps_pb2.DT_INT32, shape=[3], flat_int32=[1])
    failed(stub.Predict(short, timeout=10), 400, "holds 3 elements")
    assert ok(stub.Predict(msg(str_data="still here"), timeout=10)).str_data == "still here"


# -- streaming -----------------------------------------------------------------------


def test_streaming_sends_parts_as_the_model_yields_them(stub: Any) -> None:
    options = [("chunks", "3"), ("chunk_delay_s", "1.0")]
    stamped = [
        (time.monotonic(), reply)
        for reply in stub.PredictStreaming(msg(str_data="abcdef"), metadata=options, timeout=30)
    ]
    assert [ok(reply).str_data for _t, reply in stamped] == ["ab", "cd", "ef"]
    assert stamped[-1][0] - stamped[0][0] > 1.0


def test_streaming_failures_and_models_that_do_not_stream(stub: Any) -> None:
    (only,) = list(stub.PredictStreaming(msg(model="nope", str_data="x"), timeout=10))
    failed(only, 404, "nope")
    request = msg(model="forward")
    request.gtensors.tensors.add(
        name="x", dtype=grps_pb2.DT_FLOAT64, shape=[1, 1], flat_float64=[2]
    )
    (reply,) = list(stub.PredictStreaming(request, timeout=10))
    assert list(ok(reply).gtensors.tensors[0].flat_float64) == [4.0]


def echo_depth(client: ModelClient) -> int:
    return sum(client.status.read(slot).depth for slot in client.router.slots["echo"])


def test_a_cancelled_stream_stops_the_model(stub: Any, client: ModelClient) -> None:
    options = [("chunks", "40"), ("chunk_delay_s", "0.25")]  # 10 s if nobody stops it
    call = stub.PredictStreaming(msg(str_data="x" * 40), metadata=options, timeout=30)
    ok(next(call))
    assert eventually(lambda: echo_depth(client) == 1, 2.0)
    call.cancel()
    assert eventually(lambda: echo_depth(client) == 0, timeout_s=5.0)


def test_many_calls_at_once(stub: Any) -> None:
    results: list[str] = []

    def run(index: int) -> None:
        reply = stub.Predict(msg(str_data=f"call {index}"), timeout=30)
        results.append(ok(reply).str_data)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == sorted(f"call {i}" for i in range(16))
