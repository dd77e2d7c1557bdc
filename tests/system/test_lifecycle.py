"""Start, drain and stop: SIGTERM loses nothing; kill -9 leaves nothing for long."""

from __future__ import annotations

import http.client
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from appliance.core.segment import SHM_DIR
from tests.system.harness import (
    ROOT,
    demo_models,
    make_config,
    new_run_dir,
    running,
    start,
)
from tests.system.test_failures import call_in_thread
from tests.system.test_health import http_status

SLOW = {"name": "slow", "class": "tests.models:Slow"}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_drains_requests_in_flight_then_exits_0(signum: int) -> None:
    with running([SLOW], server={"grace_s": 0.5}) as appliance:
        client = appliance.client()
        calls = [
            call_in_thread(
                lambda: (
                    client.infer("slow", {"x": np.ones(3, np.float32)}, parameters={"sleep_s": 0.4})
                    .array("y")
                    .tolist()
                )
            )
            for _ in range(3)
        ]
        time.sleep(0.1)
        appliance.process.send_signal(signum)
        time.sleep(0.1)
        # Offline at once, still serving during the grace period.
        assert http_status(appliance, "/v2/health/ready") == 503
        assert http_status(appliance, "/v2/health/live") == 200
        for thread, outcome in calls:
            thread.join(30)
            assert outcome.get("result") == [1.0, 1.0, 1.0], outcome
        assert appliance.process.wait(60) == 0
        log = appliance.log()
        assert f"{signal.Signals(signum).name}: draining" in log
        assert "drain timeout" not in log


def test_idle_keep_alive_connections_do_not_hold_up_a_stop() -> None:
    with running(demo_models("echo"), server={"stop_timeout_s": 20.0}) as appliance:
        connections = []
        for _ in range(4):  # kept open after a request, as tritonclient does
            conn = http.client.HTTPConnection("127.0.0.1", appliance.ports["http"], timeout=5)
            conn.request("GET", "/v2/health/live")
            assert conn.getresponse().read() == b""
            connections.append(conn)
        started = time.monotonic()
        appliance.process.send_signal(signal.SIGTERM)
        assert appliance.process.wait(30) == 0
        took = time.monotonic() - started
        for conn in connections:
            conn.close()
    # The HTTP workers close idle connections at once instead of waiting them out.
    assert took < 10.0, took


def test_kill_9_of_the_master_is_cleaned_by_the_next_start() -> None:
    first_dir = new_run_dir()
    first = start(make_config(first_dir, demo_models("echo")))
    try:
        tree = first.tree
        first.remember_pids()
        first.process.kill()
        first.process.wait()
        # Children follow their master (PR_SET_PDEATHSIG) ...
        first.pids.discard(first.process.pid)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(
            Path(f"/proc/{pid}").exists() for pid in first.pids
        ):
            time.sleep(0.05)
        # ... and the next appliance to start removes what the dead tree left.
        with running(demo_models("echo")):
            assert not list(SHM_DIR.glob(f"appliance-{tree}-*"))
        first.assert_clean()
    finally:
        shutil.rmtree(first_dir, ignore_errors=True)


def test_a_bad_config_is_refused_with_its_key(tmp_path: Path) -> None:
    config = make_config(tmp_path, [{"name": "x", "class": "nocolon", "instances": 0}])
    path = tmp_path / "bad.toml"
    path.write_text(tomli_w.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "models[0].class: expected 'module:Class'" in result.stderr


def test_a_port_in_use_is_refused_clearly() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run_dir = new_run_dir()
        try:
            config = make_config(run_dir, demo_models("echo"), http={"port": port})
            appliance = start(config, wait=False)
            assert appliance.process.wait(60) == 1
            assert f"cannot use 127.0.0.1:{port} (http.port)" in appliance.log()
            assert not list(run_dir.glob("*.sock"))
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
