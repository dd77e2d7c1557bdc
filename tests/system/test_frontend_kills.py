"""kill -9 of every kind of frontend under load, with the default process counts.

By default ("auto") gRPC and MIP run at least two processes on their ports,
and HTTP's port is the master's (gunicorn gets it passed), so killing any
one frontend never closes a port: a prober opens new connections to every
port throughout and none may be refused. On a small host HTTP has one
worker, and new connections wait in the port's queue while gunicorn
replaces it. Several threads per protocol call ``faulty`` (y = 2x) with
stock clients that reconnect after an error; only calls on the killed
process's connections may fail (at most one per client thread of that
transport), none on other transports, and none hang. The master (or
gunicorn's arbiter) restarts the killed child. The counts per protocol are
printed.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import pytest

from tests.system import traffic
from tests.system.harness import Appliance, eventually, running

THREADS = 3
PACE_S = 0.02
WAIT_S = 20.0
AUTO = {"workers": "auto"}
# Which protocols ride each transport's port, and the process to kill there.
VICTIMS = {
    "http": ("http worker", (traffic.KserveRest, traffic.UmBridge)),
    "grpc": ("grpc", (traffic.KserveGrpc,)),
    "mip": ("mip", (traffic.Mip,)),
}


class Prober(threading.Thread):
    """Open (and close) a new connection to every port every few ms; count refusals."""

    def __init__(self, ports: dict[str, int]) -> None:
        super().__init__(name="prober", daemon=True)
        self.ports = ports
        self.accepted = dict.fromkeys(ports, 0)
        self.refused: list[tuple[str, str]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.01):
            for name, port in self.ports.items():
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
                    self.accepted[name] += 1
                except OSError as ex:
                    self.refused.append((name, repr(ex)))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5.0)


def live_pids(served: Appliance, role: str) -> set[int]:
    """The live, ready processes of a role ("grpc" stands for grpc[0], grpc[1], ...)."""
    return {
        int(p["pid"])
        for p in served.processes()
        if p["role"].split("[")[0] == role
        and p["pid"]
        and p["state"] == "ready"
        and _alive(int(p["pid"]))
    }


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def counts(calls: list[traffic.Call]) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for call in calls:
        entry = found.setdefault(call.protocol, {"answered": 0, "failed": 0})
        entry["failed" if call.error else "answered"] += 1
    return found


@pytest.fixture
def served() -> Any:
    model = {"name": "faulty", "class": "tests.system.faulty:Faulty", "instances": 2}
    with running(
        [model],
        server={"stop_timeout_s": 3.0},
        http=AUTO,
        grpc=AUTO,
        mip={**AUTO, "listeners": [{"port": 0, "model": "faulty"}]},
    ) as appliance:
        yield appliance


def test_killing_any_frontend_keeps_its_port_open_and_fails_only_its_calls(
    served: Appliance,
) -> None:
    ports = served.ports
    ep = traffic.Endpoints(ports["http"], ports["grpc"], ports["mip"], "faulty")
    callers = [c for _, kinds in VICTIMS.values() for c in kinds]
    loops = traffic.start_loops(ep, PACE_S, callers * THREADS)
    prober = Prober({name: ports[name] for name in VICTIMS})
    prober.start()
    report: list[str] = []
    try:
        assert eventually(lambda: traffic.all_succeeded_since(loops, 0.0), WAIT_S)
        for transport, (role, kinds) in VICTIMS.items():
            before = live_pids(served, role)
            fewest = 1 if transport == "http" else 2
            assert len(before) >= fewest, f"{transport}: expected >= {fewest}, got {before}"
            since = time.monotonic()
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            wanted = len(before)
            restarted = eventually(
                lambda role=role, victim=victim, wanted=wanted: (
                    len(live_pids(served, role) - {victim}) == wanted
                ),
                WAIT_S,
            )
            assert restarted, f"{transport}: {role} not restarted: {served.processes()}"
            back = time.monotonic()
            assert eventually(lambda back=back: traffic.all_succeeded_since(loops, back), WAIT_S)
            calls = traffic.calls_between(loops, since, time.monotonic())
            window = counts(calls)
            errors = sorted({f"{c.protocol}: {c.error}" for c in calls if c.error})
            report.append(f"kill -9 {role} (pid {victim}): {window}")
            ours = {kind.protocol for kind in kinds}
            for protocol, entry in window.items():
                bound = THREADS if protocol in ours else 0
                assert entry["failed"] <= bound, (transport, protocol, window, errors)
    finally:
        prober.stop()
        hung = traffic.stop_loops(loops)
        everything = counts([c for loop in loops for c in loop.calls])
        print()
        print("\n".join(report))
        for protocol, entry in sorted(everything.items()):
            stuck = sum(1 for loop in loops if loop.protocol == protocol and loop.is_alive())
            print(
                f"{protocol}: answered {entry['answered']}, failed {entry['failed']}, hung {stuck}"
            )
        print(f"new connections accepted per port: {prober.accepted}; refused: {prober.refused}")
    assert not hung, f"calls still running at the end: {hung}"
    assert not prober.refused, f"a port refused new connections: {prober.refused[:5]}"
    assert all(prober.accepted.values()), prober.accepted
