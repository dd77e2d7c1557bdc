"""Kill -9 of a model worker under load: only the requests it held fail.

Two client threads per protocol (KServe REST and gRPC with tritonclient,
GRPS, GraphPipe, UM-Bridge, MIP; tests/system/traffic.py) call a model with
one instance, then one with two, while its worker #0 is killed. Each thread
has one call in flight, so at most one call per thread may fail (the one
the dead worker held); the calls that arrive while a lone instance restarts
wait for it (client/restarts.py). No call hangs. The counts are printed
(``pytest -s``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import pytest

from tests.system import traffic
from tests.system.harness import Appliance, eventually, running

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

THREADS_PER_PROTOCOL = 2
PACE_S = 0.02
BEFORE_S = 2.0
AFTER_S = 2.0
# A call longer than this counts as hung: the restart wait (5 s) is well inside it.
HUNG_S = traffic.CALL_TIMEOUT_S


@dataclass
class Count:
    answered: int = 0
    failed: int = 0
    hung: int = 0
    errors: list[str] = field(default_factory=list)


@pytest.mark.parametrize("instances", [1, 2])
def test_kill_9_of_a_model_worker_fails_at_most_the_calls_in_flight(instances: int) -> None:
    model = {"name": "faulty", "class": "tests.system.faulty:Faulty", "instances": instances}
    with running([model], mip={"listeners": [{"port": 0, "model": "faulty"}]}) as appliance:
        counts, unfinished = _load_and_kill(appliance)
    print(f"\nkill -9 of model worker 1 of {instances}, {THREADS_PER_PROTOCOL} threads/protocol:")
    for protocol, count in sorted(counts.items()):
        print(
            f"  {protocol:12} answered {count.answered:5}  failed {count.failed}  "
            f"hung {count.hung}  {count.errors[:1]}"
        )
    assert not unfinished, f"calls still running at the end: {unfinished}"
    for protocol, count in counts.items():
        assert count.answered > 0, protocol
        assert count.hung == 0, (protocol, count)
        assert count.failed <= THREADS_PER_PROTOCOL, (protocol, count)


def _load_and_kill(appliance: Appliance) -> tuple[dict[str, Count], list[str]]:
    ports = appliance.ports
    ep = traffic.Endpoints(ports["http"], ports["grpc"], ports["mip"], "faulty")
    loops = traffic.start_loops(ep, PACE_S, traffic.EVERY_PROTOCOL * THREADS_PER_PROTOCOL)
    try:
        assert eventually(lambda: traffic.all_succeeded_since(loops, time.monotonic() - 1), 30.0)
        time.sleep(BEFORE_S)
        victim = appliance.pid_of("model[faulty#0]")
        os.kill(victim, signal.SIGKILL)
        assert eventually(lambda: _restarted(appliance, victim), 30.0, interval_s=0.1)
        time.sleep(AFTER_S)
        appliance.remember_pids()
    finally:
        unfinished = traffic.stop_loops(loops)
    counts: dict[str, Count] = {}
    for loop in loops:
        count = counts.setdefault(loop.protocol, Count())
        for call in loop.calls:
            if call.ended - call.started > HUNG_S:
                count.hung += 1
            elif call.error:
                count.failed += 1
                count.errors.append(call.error)
            else:
                count.answered += 1
    return counts, unfinished


def _restarted(appliance: Appliance, victim: int) -> bool:
    return any(
        p["role"] == "model[faulty#0]" and p["pid"] not in (0, victim) and p["state"] == "ready"
        for p in appliance.processes()
    )
