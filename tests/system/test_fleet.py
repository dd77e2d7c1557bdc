"""Two hosts behind a real HAProxy, under load on every protocol: nothing lost.

Two appliances on loopback, each with fixed ports and its own run dir, and
HAProxy in front with the config deploy/haproxy writes (readiness checks
every 200 ms). Stock clients loop over every protocol through the balancer
while one host goes offline and back, reloads with a changed model, drains
on SIGTERM and starts again, both are upgraded by deploy/rolling.sh, and one
master is killed with SIGKILL. Only that last phase may fail requests (those
in flight on the killed host), and none once the balancer's check interval
has passed. The counts per phase are printed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from appliance.processes.control import ControlError, request
from tests.system.harness import (
    ROOT,
    Appliance,
    _alive,
    eventually,
    free_ports,
    make_config,
    new_run_dir,
    start,
)
from tests.system.protocol_load import ProtocolLoad, scaled

HAPROXY = shutil.which("haproxy")
pytestmark = [
    pytest.mark.skipif(
        HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy)"
    ),
    # graphpipe 1.0.4 calls EndVector(n), deprecated since flatbuffers 2.0.7.
    pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning"),
    # Over 40 s of load through the balancer: make test-long, so that make test
    # keeps under its 15 minutes.
    pytest.mark.long,
]

CHECK_INTER_MS = 200
# The balancer has seen a readiness change after one check interval plus the
# check's own timeout; a second of margin for this shared machine.
BALANCER_WAIT_S = 1.0


def _haproxy_config() -> Any:
    path = ROOT / "deploy" / "haproxy" / "haproxy_config.py"
    spec = importlib.util.spec_from_file_location("haproxy_config", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["haproxy_config"] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Host:
    """One appliance with fixed ports; restarted on the same ones."""

    run_dir: Path
    config: dict[str, Any]
    started: list[Appliance] = field(default_factory=list)
    control_path: Path = Path()
    pids: set[int] = field(default_factory=set)
    trees: set[str] = field(default_factory=set)

    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.toml"

    def start(self) -> None:
        app = start(self.config)
        self.started.append(app)
        self.control_path = app.control
        self.pids |= app.pids

    def status(self) -> dict[str, Any]:
        return request(self.control_path, "status")

    def ctl(self, command: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "appliance", "ctl", "--config", str(self.config_path), command],
            check=True,
            capture_output=True,
            timeout=60,
            cwd=ROOT,
        )

    def master_pid(self) -> int:
        return int(self.status()["pid"])

    def remember(self) -> None:
        with contextlib.suppress(ControlError, OSError):
            status = self.status()
            self.pids |= {int(p["pid"]) for p in status["processes"] if p["pid"]}
            self.trees.add(str(status["tree"]))

    def stop(self) -> None:
        """SIGTERM whichever master serves now (ours or rolling.sh's), wait it out."""
        self.remember()
        with contextlib.suppress(ControlError, OSError):
            os.kill(self.master_pid(), signal.SIGTERM)
        for app in self.started:  # reaped, whichever of them rolling.sh replaced
            with contextlib.suppress(subprocess.TimeoutExpired):
                app.process.wait(60)
        eventually(lambda: not any(_alive(pid) for pid in self.pids), 60.0, 0.1)
        for pid in self.pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@dataclass
class Front:
    """What ProtocolLoad needs of an appliance: the balancer's ports."""

    ports: dict[str, int]
    state: dict[str, Any]


class Phases:
    """Answered and failed requests per phase of the test."""

    def __init__(self, load: ProtocolLoad) -> None:
        self.load = load
        self.rows: list[tuple[str, int, int]] = []
        self.mark = self.counts()

    def counts(self) -> tuple[int, int]:
        with self.load.lock:
            return self.load.successes.total(), len(self.load.failures)

    def end(self, name: str) -> int:
        answered, failed = self.counts()
        self.rows.append((name, answered - self.mark[0], failed - self.mark[1]))
        for failure in sorted(set(self.load.failures[self.mark[1] : failed]))[:5]:
            print(f"  {name}: {failure[:300]}")
        self.mark = (answered, failed)
        return failed - self.rows[-1][2]

    def report(self) -> str:
        lines = [f"{'phase':<34}{'answered':>9}{'failed':>8}"]
        lines += [f"{name:<34}{a:>9}{f:>8}" for name, a, f in self.rows]
        return "\n".join(lines)


def host_config(run_dir: Path, http: int, grpc: int, mip: int, factor: float) -> dict[str, Any]:
    return make_config(
        run_dir,
        [scaled(factor)],
        server={"default_model": "scaled", "grace_s": 1.0},
        http={"port": http, "workers": 1},
        grpc={"port": grpc},
        mip={"listeners": [{"port": mip, "model": "scaled"}]},
    )


def rewrite(host: Host, factor: float) -> None:
    host.config["models"] = [scaled(factor)]
    host.config_path.write_text(tomli_w.dumps(host.config))


def test_a_fleet_behind_haproxy_loses_nothing() -> None:
    generator = _haproxy_config()
    ports = free_ports(9)
    hosts = [
        Host(run_dir, host_config(run_dir, *ports[3 * i : 3 * i + 3], factor=2.0))
        for i, run_dir in enumerate([new_run_dir(), new_run_dir()])
    ]
    front_http, front_grpc, front_mip = free_ports(3)
    lb_dir = new_run_dir()
    cfg = lb_dir / "haproxy.cfg"
    cfg.write_text(
        generator.render(
            [generator.Host("127.0.0.1", *ports[3 * i : 3 * i + 3]) for i in range(2)],
            front_http,
            front_grpc,
            front_mip,
            bind="127.0.0.1",
            inter_ms=CHECK_INTER_MS,
            log_stdout=True,
        )
    )
    haproxy: subprocess.Popen[bytes] | None = None
    try:
        for host in hosts:
            host.start()
        with (lb_dir / "haproxy.log").open("wb") as log:
            haproxy = subprocess.Popen(
                [str(HAPROXY), "-db", "-f", str(cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        time.sleep(BALANCER_WAIT_S)
        assert haproxy.poll() is None, (lb_dir / "haproxy.log").read_text()
        front = Front(
            {"http": front_http, "grpc": front_grpc},
            {"mip_listeners": [{"port": front_mip, "model": "scaled"}]},
        )
        with ProtocolLoad(front) as load:  # type: ignore[arg-type]
            phases = Phases(load)
            load.wait_each(5)
            phases.end("both hosts")

            hosts[0].ctl("offline")
            time.sleep(BALANCER_WAIT_S)
            load.wait_each(5)
            hosts[0].ctl("online")
            time.sleep(BALANCER_WAIT_S)
            load.wait_each(5)
            phases.end("host 0 offline and online")

            rewrite(hosts[1], 3.0)
            hosts[1].ctl("reload")
            assert eventually(lambda: hosts[1].status()["reloading"] is None, 60.0, 0.1)
            load.wait_each(5)
            phases.end("host 1 reloaded (factor 3)")

            hosts[0].stop()
            load.wait_each(5)
            hosts[0].start()
            time.sleep(BALANCER_WAIT_S)
            load.wait_each(5)
            phases.end("host 0 SIGTERM drain, restart")

            for host in hosts:
                host.remember()
                rewrite(host, 4.0)
            rolling = subprocess.run(
                [str(ROOT / "deploy" / "rolling.sh"), *(str(h.config_path) for h in hosts)],
                env={
                    **os.environ,
                    "APPLIANCE": f"{sys.executable} -m appliance",
                    "BALANCER_WAIT_S": str(BALANCER_WAIT_S),
                    "PYTHONPATH": str(ROOT),
                },
                capture_output=True,
                text=True,
                timeout=240,
                cwd=ROOT,
            )
            print(rolling.stdout, rolling.stderr)
            assert rolling.returncode == 0, rolling.stderr
            for host in hosts:
                host.remember()
            load.wait_each(5)
            phases.end("rolling upgrade (factor 4)")
            failed_before_kill = phases.mark[1]

            victim = hosts[1].master_pid()
            os.kill(victim, signal.SIGKILL)
            time.sleep(BALANCER_WAIT_S)
            phases.end("host 1 master SIGKILL")
            load.wait_each(10)
            phases.end("after the check interval")

            hosts[1].start()  # sweeps what the killed tree left in /dev/shm
            hosts[1].remember()
            time.sleep(BALANCER_WAIT_S)
            load.wait_each(5)
            phases.end("host 1 started again")
        print(phases.report())
        print(f"factors seen: {load.seen}")
        failures = load.failures
        assert failures[:failed_before_kill] == [], failures
        after_kill = sum(failed for _name, _answered, failed in phases.rows[-2:])
        assert after_kill == 0, failures[-after_kill:]
        assert all(4.0 in seen for seen in load.seen.values()), load.seen
    finally:
        if haproxy is not None:
            haproxy.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                haproxy.wait(10)
            if haproxy.poll() is None:
                haproxy.kill()
                haproxy.wait()
        for host in hosts:
            host.stop()
        for host in hosts:
            leftover = [p for p in host.pids if _alive(p)]
            assert not leftover, f"processes still alive: {leftover}"
            segments = [p for t in host.trees for p in Path("/dev/shm").glob(f"appliance-{t}-*")]
            assert not segments, f"shared-memory segments left: {segments}"
            shutil.rmtree(host.run_dir, ignore_errors=True)
        events = [
            line
            for line in (lb_dir / "haproxy.log").read_text(errors="replace").splitlines()
            if " is UP" in line or " is DOWN" in line or " 503 " in line
        ]
        print("haproxy:", *events[:60], sep="\n")
        shutil.rmtree(lb_dir, ignore_errors=True)
