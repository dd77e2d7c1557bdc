"""Faults under load: stock clients loop on every protocol while processes die.

One appliance serves ``faulty`` (tests/system/faulty.py: y = 2x) with two
instances, two HTTP workers, two gRPC and two MIP processes, so every kind
of process has a twin that keeps serving. Six loops (KServe REST and gRPC
with tritonclient, GRPS with requests, GraphPipe's and UM-Bridge's clients,
our MIP client) call it about 40 times a second each for the whole module.
Each test injects one fault and checks:

- no call hangs: every call returns within its client's bound;
- only calls in flight on the failed process fail (they overlap the fault),
  each with a clear error of the expected kind;
- full service again within RECOVERY_S of when the fault can be noticed
  (at once; a hang after max_busy_s): the master (or gunicorn's arbiter) has
  a replacement running and ready, and every protocol answers again. On an
  oversubscribed machine the bound stretches by the load average per CPU.

Killing the gunicorn arbiter fails no call: the master owns the HTTP
listening socket, so connections queue in the kernel while a new arbiter
starts, and the orphaned workers finish what they hold.

Measured numbers (time to full service, calls failed per fault) are printed
(``pytest -s`` or ``-rP``) and written to ``faults.json`` in the module's
tmp dir, whose path is printed too.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.system import faulty, traffic
from tests.system.harness import Appliance, running

# graphpipe's client calls a flatbuffers API that warns (its loop runs in a thread).
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

MAX_BUSY_S = 1.0
PACE_S = 0.025
# Full service again this soon after a fault is noticed, on a machine that is
# not oversubscribed: a restart is a new interpreter importing its modules,
# CPU-bound, so the bound stretches with the load average per CPU.
RECOVERY_S = 2.0
# A failed call must have started before the failed process was seen gone,
# give or take this (the status table, a reap and a poll lie in between).
IN_FLIGHT_SLACK_S = 0.3
WAIT_S = 20.0
POLL_S = 0.02

MODEL_LOST = ("holding this request exited",)
# What a client says when the process at the other end of its connection dies.
CONNECTION_LOST = (
    "Connection reset",
    "Connection aborted",
    "ConnectionResetError",
    "RemoteDisconnected",
    "closed the connection",
    "ConnectionError",
    "Connection refused",
    "connection closed",
    "Socket closed",
    "StatusCode.UNAVAILABLE",
    "Broken pipe",
)


@dataclass
class Fault:
    """What a fault did: when it hit, to which process, and what may fail."""

    name: str
    at: float
    victim: int
    role: str
    errors: tuple[str, ...]
    # How long after it hits the fault can be noticed (a hang: max_busy_s).
    noticed_after_s: float = 0.0
    gone_at: float | None = None
    restored_at: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def fault_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def served(fault_dir: Path) -> Iterator[Appliance]:
    model = {
        "name": "faulty",
        "class": "tests.system.faulty:Faulty",
        "instances": 2,
        "max_busy_s": MAX_BUSY_S,
        "options": {"fault_dir": str(fault_dir)},
    }
    with running(
        [model],
        # gunicorn's graceful_timeout: how long orphaned HTTP workers linger.
        server={"stop_timeout_s": 3.0},
        http={"workers": 2, "threads": 4},
        grpc={"workers": 2},
        mip={"workers": 2, "listeners": [{"port": 0, "model": "faulty"}]},
    ) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def loops(served: Appliance) -> Iterator[list[traffic.Loop]]:
    ports = served.ports
    ep = traffic.Endpoints(ports["http"], ports["grpc"], ports["mip"], "faulty")
    running_loops = traffic.start_loops(ep, PACE_S)
    yield running_loops
    hung = traffic.stop_loops(running_loops)
    assert not hung, f"client calls still running at the end: {hung}"


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return []


# -- injecting --------------------------------------------------------------------


def kill(served: Appliance, role: str, name: str) -> Fault:
    pid = served.pid_of(role)
    os.kill(pid, signal.SIGKILL)
    return Fault(name, time.monotonic(), pid, role, CONNECTION_LOST)


def kill_model_worker(served: Appliance, _dir: Path) -> Fault:
    fault = kill(served, "model[faulty#0]", "kill -9 model worker")
    fault.errors = MODEL_LOST
    return fault


def kill_http_worker(served: Appliance, _dir: Path) -> Fault:
    return kill(served, "http worker", "kill -9 http worker")


def kill_grpc(served: Appliance, _dir: Path) -> Fault:
    return kill(served, "grpc[0]", "kill -9 grpc process")


def kill_mip(served: Appliance, _dir: Path) -> Fault:
    return kill(served, "mip[1]", "kill -9 mip process")


def kill_arbiter(served: Appliance, _dir: Path) -> Fault:
    fault = kill(served, "http", "kill -9 gunicorn arbiter")
    fault.notes["old_workers"] = [
        p["pid"] for p in served.processes() if p["role"] == "http worker"
    ]
    return fault


def armed(
    kind: str, name: str, errors: tuple[str, ...], noticed_after_s: float = 0.0
) -> Callable[[Appliance, Path], Fault]:
    def inject(served: Appliance, fault_dir: Path) -> Fault:
        roles = {p["pid"]: p["role"] for p in served.processes()}
        faulty.arm(fault_dir, kind)
        deadline = time.monotonic() + WAIT_S
        while (took := faulty.taken(fault_dir)) is None:
            assert time.monotonic() < deadline, f"no request took the {kind} fault"
            time.sleep(0.005)
        pid, at = took
        return Fault(name, at, pid, roles.get(pid, "?"), errors, noticed_after_s)

    return inject


FAULTS: dict[str, Callable[[Appliance, Path], Fault]] = {
    "model-kill": kill_model_worker,
    "http-worker-kill": kill_http_worker,
    "model-hang": armed("hang", "model hangs past max_busy_s", MODEL_LOST, MAX_BUSY_S),
    "grpc-kill": kill_grpc,
    "model-raise": armed("raise", "model raises", ("injected fault: this batch raises",)),
    "mip-kill": kill_mip,
    "model-abort": armed("abort", "model aborts (SIGABRT)", MODEL_LOST),
    "arbiter-kill": kill_arbiter,
}


# -- watching ---------------------------------------------------------------------


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def serving(processes: list[dict[str, Any]], fault: Fault) -> bool:
    """The victim is gone, and a replacement (and everything else) is ready."""
    if alive(fault.victim):
        return False
    children = [p for p in processes if p["role"] not in ("master", "http worker")]
    if any(p["pid"] == fault.victim or p["state"] != "ready" for p in children):
        return False
    # ctl status may still list a dead HTTP worker's slot: count live workers,
    # and after an arbiter's death only those of its successor.
    old = set(fault.notes.get("old_workers", []))
    workers = [p["pid"] for p in processes if p["role"] == "http worker"]
    return len([pid for pid in workers if pid not in old and alive(pid)]) == 2


def watch_recovery(served: Appliance, fault: Fault) -> None:
    """Note when the victim was gone and when a replacement served."""
    deadline = time.monotonic() + WAIT_S
    needs_restart = "raise" not in fault.name
    while time.monotonic() < deadline:
        now = time.monotonic()
        if fault.gone_at is None and not (needs_restart and alive(fault.victim)):
            fault.gone_at = now
        if fault.gone_at is not None and (not needs_restart or serving(served.processes(), fault)):
            fault.restored_at = time.monotonic()
            return
        time.sleep(POLL_S)
    raise AssertionError(f"{fault.name}: not serving again after {WAIT_S} s: {served.processes()}")


def wait_until_all_succeed(loops: list[traffic.Loop], since: float) -> float:
    deadline = time.monotonic() + WAIT_S
    while not traffic.all_succeeded_since(loops, since):
        if time.monotonic() >= deadline:
            last = {
                loop.protocol: loop.calls[-1].error if loop.calls else "no call" for loop in loops
            }
            raise AssertionError(f"not every protocol answers since {since}: {last}")
        time.sleep(POLL_S)
    return time.monotonic()


# -- the tests --------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FAULTS))
def test_fault_under_load(
    name: str,
    served: Appliance,
    fault_dir: Path,
    loops: list[traffic.Loop],
    results: list[dict[str, Any]],
) -> None:
    steady_at = wait_until_all_succeed(loops, time.monotonic())
    fault = FAULTS[name](served, fault_dir)
    watch_recovery(served, fault)
    assert fault.gone_at is not None
    assert fault.restored_at is not None
    answered_at = wait_until_all_succeed(loops, fault.restored_at)
    time.sleep(0.3)
    calls = traffic.calls_between(loops, steady_at, time.monotonic())
    record = measure(fault, calls, answered_at)
    results.append(record)
    print(json.dumps(record))

    stuck = {loop.protocol: loop.stuck_s() for loop in loops if loop.stuck_s() > WAIT_S}
    assert not stuck, f"calls hanging: {stuck}"
    assert record["slowest_call_s"] < traffic.CALL_TIMEOUT_S, record
    failed = [c for c in calls if c.error]
    unclear = [c for c in failed if not any(text in c.error for text in fault.errors)]
    assert not unclear, f"{name}: failures without the expected error: {unclear}"
    late = [c for c in failed if c.started > fault.gone_at + IN_FLIGHT_SLACK_S]
    assert not late, f"{name}: calls that started after the fault failed: {late}"
    early = [c for c in failed if c.ended < fault.at]
    assert not early, f"{name}: calls failed before the fault: {early}"
    assert record["recovery_s"] <= record["bound_s"], record


def test_the_measured_numbers(fault_dir: Path, results: list[dict[str, Any]]) -> None:
    """Print every fault's numbers as a table, and keep them in faults.json."""
    path = fault_dir / "faults.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"\nfault injection under load ({len(results)} faults), written to {path}")
    print(table(results))
    assert len(results) == len(FAULTS)


def measure(fault: Fault, calls: list[traffic.Call], answered_at: float) -> dict[str, Any]:
    assert fault.gone_at is not None
    assert fault.restored_at is not None
    failed = [c for c in calls if c.error]
    slowest = max(calls, key=lambda c: c.ended - c.started)
    by_protocol: dict[str, int] = {}
    for call in failed:
        by_protocol[call.protocol] = by_protocol.get(call.protocol, 0) + 1
    return {
        "fault": fault.name,
        "victim": f"{fault.role} (pid {fault.victim})",
        "gone_s": round(fault.gone_at - fault.at, 3),
        "replacement_ready_s": round(fault.restored_at - fault.at, 3),
        "full_service_s": round(max(fault.restored_at, answered_at) - fault.at, 3),
        "recovery_s": round(
            max(fault.restored_at, answered_at) - fault.at - fault.noticed_after_s, 3
        ),
        "bound_s": recovery_bound_s(),
        "calls": len(calls),
        "failed": len(failed),
        "failed_by_protocol": by_protocol,
        "slowest_call_s": round(slowest.ended - slowest.started, 3),
        "slowest_call": f"{slowest.protocol} {slowest.error or 'ok'}"[:160],
        "errors": sorted({c.error[:160] for c in failed})[:6],
    }


def recovery_bound_s() -> float:
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return round(RECOVERY_S * max(1.0, load), 2)


def table(records: list[dict[str, Any]]) -> str:
    lines = [
        f"{'fault':30} {'gone s':>7} {'ready s':>8} {'service s':>10} {'recovery s':>11} "
        f"{'bound s':>8} {'calls':>6} {'failed':>7} {'slowest s':>10}"
    ]
    for r in records:
        lines.append(
            f"{r['fault']:30} {r['gone_s']:7.3f} {r['replacement_ready_s']:8.3f} "
            f"{r['full_service_s']:10.3f} {r['recovery_s']:11.3f} {r['bound_s']:8.2f} "
            f"{r['calls']:6d} {r['failed']:7d} {r['slowest_call_s']:10.3f}"
        )
    return "\n".join(lines)
