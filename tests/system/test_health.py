"""Readiness on every transport follows the master's online flag."""

from __future__ import annotations

import http.client
import socket
import struct
import subprocess
import sys

import grpc

from appliance._generated import health_pb2, health_pb2_grpc
from tests.system.harness import Appliance, demo_models, eventually, running


def http_status(appliance: Appliance, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", appliance.ports["http"], timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def grpc_serving(appliance: Appliance) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{appliance.ports['grpc']}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def mip_ping(appliance: Appliance) -> bytes:
    with socket.create_connection(("127.0.0.1", appliance.ports["mip"]), timeout=5) as conn:
        conn.sendall(struct.pack("!4BL", 0, 1, 0, 0, 0))
        return conn.recv(8)


PONG = bytes([0, 1, 1, 0, 0, 0, 0, 0])


def test_everything_is_ready_after_start(demo: Appliance) -> None:
    assert http_status(demo, "/v2/health/live") == 200
    assert http_status(demo, "/v2/health/ready") == 200
    assert grpc_serving(demo)
    assert mip_ping(demo) == PONG


def test_offline_turns_every_protocol_not_ready_and_online_back(demo: Appliance) -> None:
    demo.ctl("offline")
    try:
        assert eventually(lambda: http_status(demo, "/v2/health/ready") == 503, 1.0, 0.02)
        assert not grpc_serving(demo)
        assert mip_ping(demo)[:3] == bytes([0, 0, 5])
        # Live stays true, and requests are still served while offline.
        assert http_status(demo, "/v2/health/live") == 200
        client = demo.client()
        with client.infer("forward", {"x": [[1.0]]}) as result:
            assert result.array("y").tolist() == [[2.0]]
    finally:
        demo.ctl("online")
    assert eventually(lambda: http_status(demo, "/v2/health/ready") == 200, 1.0, 0.02)
    assert grpc_serving(demo)
    assert mip_ping(demo) == PONG


def test_ctl_status_lists_every_process(demo: Appliance) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "ctl", "--socket", str(demo.control), "status"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    text = result.stdout
    assert "online, ready" in text
    assert "requests/s" in text
    for role in ("master", "model[simple#0]", "model[echo#0]", "http", "grpc[0]", "mip[0]"):
        assert role in text
    assert "http worker" in text
    reply = demo.ctl("status")
    roles = {p["role"] for p in reply["processes"]}
    assert {"master", "http", "grpc[0]", "mip[0]", "model[digits#0]"} <= roles
    models = [p for p in reply["processes"] if p["model"]]
    assert all(p["state"] == "ready" and p["restarts"] == 0 for p in models)
    assert all(p["rss_bytes"] for p in reply["processes"] if p["role"] != "master")


def test_ctl_without_an_appliance_says_so(tmp_path: object) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "ctl", "--socket", "/tmp/no-such.sock", "status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "no appliance is running" in result.stderr


def test_ready_only_once_every_http_worker_has_booted() -> None:
    # gunicorn's arbiter is up before its workers: ready at that point would
    # let a balancer's first burst land on one worker while the rest boot.
    # Big request rings make each worker's boot (pre-faulting its ring) slow.
    rings = {"request_ring_bytes": 128 << 20}
    with running(demo_models("identity"), http={"workers": 8}, shm=rings) as app:
        assert app.ctl("status")["ready"]
        workers = [p for p in app.processes() if p["role"] == "http worker"]
        assert len(workers) == 8, workers
