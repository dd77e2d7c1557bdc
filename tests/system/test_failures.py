"""Processes that die or fail: nothing hangs, the master restarts them."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from appliance.errors import ApplianceError, ModelFailed, ModelNotReady, WorkerLost
from tests.system.harness import Appliance, demo_models, running
from tests.system.test_health import PONG, grpc_serving, http_status, mip_ping

SLOW = {"name": "slow", "class": "tests.models:Slow"}


def wait_for(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (ApplianceError, OSError, LookupError, grpc.RpcError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"condition not met in {timeout_s} s")


def call_in_thread(function: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    outcome: dict[str, object] = {}

    def target() -> None:
        started = time.monotonic()
        try:
            outcome["result"] = function()
        except Exception as ex:
            outcome["error"] = ex
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


@pytest.fixture(scope="module")
def appliance() -> Appliance:
    with running([SLOW, *demo_models("echo")], http={"workers": 2}) as running_appliance:
        yield running_appliance


def test_kill_9_of_a_model_worker_fails_its_request_at_once(appliance: Appliance) -> None:
    client = appliance.client()
    victim = appliance.pid_of("model[slow#0]")
    thread, outcome = call_in_thread(
        lambda: client.infer("slow", {"x": np.zeros(4, np.float32)}, parameters={"sleep_s": 30})
    )
    time.sleep(0.5)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), WorkerLost)
    assert f"pid {victim}" in str(outcome["error"])
    assert time.monotonic() - killed_at < 2.0
    # The master restarts it; the model serves again.
    wait_for(lambda: appliance.pid_of("model[slow#0]") != victim)
    wait_for(lambda: client.model_ready("slow"))
    with client.infer("slow", {"x": np.ones(4, np.float32)}) as result:
        assert result.array("y").tolist() == [1.0] * 4
    status = {p["role"]: p for p in appliance.processes()}
    assert status["model[slow#0]"]["restarts"] == 1
    assert "SIGKILL" in status["model[slow#0]"]["last_exit"]


def _successes(appliance: Appliance, model: str) -> int:
    url = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def test_statistics_go_on_counting_across_a_restart(appliance: Appliance) -> None:
    client = appliance.client()
    for _ in range(3):
        with client.infer("slow", {"x": np.ones(2, np.float32)}):
            pass
    before = _successes(appliance, "slow")
    assert before >= 3
    victim = appliance.pid_of("model[slow#0]")
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: appliance.pid_of("model[slow#0]") != victim and client.model_ready("slow"))
    # What the instance counted before it died is still there for its successor.
    assert _successes(appliance, "slow") == before
    with client.infer("slow", {"x": np.ones(2, np.float32)}):
        pass
    assert _successes(appliance, "slow") == before + 1


def test_a_model_that_raises_fails_only_its_request(appliance: Appliance) -> None:
    client = appliance.client()
    with pytest.raises(ModelFailed, match="model slow failed: ValueError: asked to fail"):
        client.infer("slow", {"x": np.zeros(2, np.float32)}, parameters={"fail": True})
    with client.infer("slow", {"x": np.zeros(2, np.float32)}) as result:
        assert result.array("y").shape == (2,)


def test_a_model_that_aborts_is_restarted(appliance: Appliance) -> None:
    client = appliance.client()
    victim = appliance.pid_of("model[slow#0]")
    with pytest.raises(WorkerLost):
        client.infer("slow", {"x": np.zeros(2, np.float32)}, parameters={"abort": True})
    wait_for(lambda: appliance.pid_of("model[slow#0]") != victim and client.model_ready("slow"))
    with client.infer("slow", {"x": np.zeros(2, np.float32)}) as result:
        assert result.array("y").shape == (2,)


def test_kill_9_of_frontends_leaves_models_alone(appliance: Appliance) -> None:
    models_before = {p["role"]: p["pid"] for p in appliance.processes() if p["model"]}
    grpc_pid = appliance.pid_of("grpc[0]")
    mip_pid = appliance.pid_of("mip[0]")
    worker_pid = appliance.pid_of("http worker")
    for pid in (grpc_pid, mip_pid, worker_pid):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: appliance.pid_of("grpc[0]") != grpc_pid and grpc_serving(appliance))
    wait_for(lambda: appliance.pid_of("mip[0]") != mip_pid and mip_ping(appliance) == PONG)
    wait_for(lambda: http_status(appliance, "/v2/health/ready") == 200)
    wait_for(lambda: len([p for p in appliance.processes() if p["role"] == "http worker"]) == 2)
    assert {p["role"]: p["pid"] for p in appliance.processes() if p["model"]} == models_before


def test_kill_9_of_the_http_arbiter_restarts_it(appliance: Appliance) -> None:
    arbiter = appliance.pid_of("http")
    os.kill(arbiter, signal.SIGKILL)
    wait_for(lambda: appliance.pid_of("http") != arbiter)
    wait_for(lambda: http_status(appliance, "/v2/health/ready") == 200)
    appliance.remember_pids()


def test_a_model_that_cannot_load_is_reported_and_the_rest_serve() -> None:
    broken = {"name": "broken", "class": "tests.models:BrokenLoad"}
    with running([broken, *demo_models("echo")]) as appliance:
        client = appliance.client()
        with client.infer("echo", {"x": np.arange(2)}) as result:
            assert result.array("x").tolist() == [0, 1]
        assert not client.server_ready()
        with pytest.raises(ModelNotReady, match=r"weights\.bin is missing"):
            client.infer("broken", {"x": np.zeros(1, np.float32)})
        status = {p["role"]: p for p in appliance.processes()}
        assert "weights.bin is missing" in status["model[broken#0]"]["note"]
        assert http_status(appliance, "/v2/health/ready") == 503
