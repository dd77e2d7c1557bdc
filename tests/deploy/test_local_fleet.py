"""The manual's one-machine fleet (docs/operations/fleet.md), as a user follows it.

``deploy/local-fleet.sh start`` brings up two hosts with the demo config and
HAProxy in front; stock clients (tritonclient over REST and gRPC) call
``simple`` through the balancer while ``deploy/rolling.sh`` drains, stops and
restarts each host in turn; ``deploy/local-fleet.sh stop`` stops it all.
No request fails, and every process and shared-memory segment is gone after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from appliance.processes.control import ControlError, request
from tests.system.harness import ROOT, _alive, eventually, free_ports

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="haproxy is not installed (Debian: haproxy)"
)

SCRIPT = ROOT / "deploy" / "local-fleet.sh"


class Fleet:
    """The script's fleet in a directory of its own, on free ports."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-", dir="/tmp"))
        ports = free_ports(9)
        self.http, self.grpc, _ = ports[:3]
        self.env = {
            **os.environ,
            "FLEET_DIR": str(self.dir),
            "FLEET_PORTS": " ".join(":".join(map(str, ports[i : i + 3])) for i in (0, 3, 6)),
            "APPLIANCE": f"{sys.executable} -m appliance",
        }
        self.configs = [self.dir / f"h{i}" / "config.toml" for i in range(2)]
        self.pids: set[int] = set()
        self.trees: set[str] = set()

    def run(self, *argv: str) -> str:
        done = subprocess.run(
            argv, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        print(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def remember(self) -> None:
        """Every running process of both hosts and HAProxy, and each host's tree."""
        for config in self.configs:
            with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
                state = orjson.loads((config.parent / "run" / "appliance.json").read_bytes())
                self.trees.add(str(state["tree"]))
                self.pids.add(int(state["pid"]))
                with contextlib.suppress(OSError, ControlError):
                    status = request(Path(state["control_socket"]), "status")
                    self.pids.update(p["pid"] for p in status["processes"] if p["pid"])
        with contextlib.suppress(FileNotFoundError, ValueError):
            self.pids.add(int((self.dir / "haproxy.pid").read_text()))

    def segments(self) -> list[str]:
        return sorted(
            p.name for tree in self.trees for p in Path("/dev/shm").glob(f"appliance-{tree}-*")
        )

    def kill_leftovers(self) -> list[int]:
        eventually(lambda: not any(_alive(pid) for pid in self.pids), 30.0, 0.1)
        alive = [pid for pid in self.pids if _alive(pid)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return alive


class Load(threading.Thread):
    """One stock client calling ``simple`` through the balancer until told to stop."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.done = threading.Event()
        self.answered = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.call()
                self.answered += 1
            except Exception as ex:
                self.failures.append(f"{type(ex).__name__}: {ex}")


def simple_call(module: Any, url: str) -> Callable[[], Any]:
    client = module.InferenceServerClient(url)
    x = np.arange(16, dtype=np.int32).reshape(1, 16)

    def call() -> None:
        inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        result = client.infer("simple", inputs)
        assert (result.as_numpy("OUTPUT0") == 2 * x).all()

    return call


@pytest.mark.long
def test_the_readme_fleet_rolls_over_without_failing_a_request() -> None:
    fleet = Fleet()
    loads: list[Load] = []
    try:
        fleet.run(str(SCRIPT), "start")
        fleet.remember()
        loads = [
            Load(simple_call(httpclient, f"127.0.0.1:{fleet.http}")),
            Load(simple_call(grpcclient, f"127.0.0.1:{fleet.grpc}")),
        ]
        for load in loads:
            load.start()
        assert eventually(lambda: all(load.answered for load in loads), 30.0)
        before = [load.answered for load in loads]
        rolled = fleet.run(str(ROOT / "deploy" / "rolling.sh"), *map(str, fleet.configs))
        assert rolled.count("upgraded") == 2
        fleet.remember()
        during = [load.answered - b for load, b in zip(loads, before, strict=True)]
        for load in loads:
            load.done.set()
            load.join(30)
        status = fleet.run(str(SCRIPT), "status")
        assert status.count("online True, ready True") == 2
        fleet.run(str(SCRIPT), "stop")
    finally:
        for load in loads:
            load.done.set()
            load.join(30)
        fleet.remember()
        leftovers = fleet.kill_leftovers()
        segments = fleet.segments()
        shutil.rmtree(fleet.dir, ignore_errors=True)
    failures = [failure for load in loads for failure in load.failures]
    print(f"rolling upgrade through HAProxy: REST, gRPC answered {during}, {len(failures)} failed")
    assert not leftovers, f"processes left running: {leftovers}"
    assert not segments, f"segments left: {segments}"
    assert all(during), "a client got no answer during the roll"
    assert not failures, failures[:5]
