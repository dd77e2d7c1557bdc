"""With server.helper_threads_batch, the threads that only carry requests run under
SCHED_BATCH, and the threads doing the work keep the default; without it (the
default) every thread keeps the default.

A woken SCHED_BATCH thread never preempts the running one, so the event loop
or model worker that wakes a helper finishes its turn first
(appliance/processes/helper_threads.py). What a user checks: ``chrt -p`` of
the threads of the processes that served a request.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.system.harness import Appliance, demo_models, running

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}
# grpcio's threads, by the start of their names.
GRPC_THREADS = ("event_engine", "grpc_global_tim", "lifeguard")


def threads(pid: int) -> Iterator[tuple[str, int]]:
    """Each thread of ``pid`` but its main one: its name and scheduling policy."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        if int(tid) != pid:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            yield name, os.sched_getscheduler(int(tid))


def policies(appliance: Appliance) -> dict[str, set[int]]:
    """Serve one request over KServe REST and one over gRPC; the policies of the
    main threads, ZeroMQ I/O threads and grpcio threads of the processes that served them."""
    http = f"http://127.0.0.1:{appliance.ports['http']}"
    reply = requests.post(f"{http}/v2/models/echo/infer", json=BODY, timeout=30)
    assert reply.status_code == 200, reply.text
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        assert client.get_server_metadata().name
    finally:
        client.close()
    served = ("http worker", "model[echo#0]", "grpc[")
    pids = [p["pid"] for p in appliance.processes() if p["pid"] and p["role"].startswith(served)]
    assert len(pids) >= 3, appliance.processes()
    seen: dict[str, set[int]] = {"main": {os.sched_getscheduler(pid) for pid in pids}}
    for pid in pids:
        for name, policy in threads(pid):
            if name.startswith("ZMQbg/IO"):
                seen.setdefault("zmq io", set()).add(policy)
            elif name.startswith(GRPC_THREADS):
                seen.setdefault("grpc", set()).add(policy)
    return seen


def test_helper_threads_batch_puts_zmq_and_grpc_threads_not_main_ones_under_batch() -> None:
    with running(demo_models("echo"), server={"helper_threads_batch": True}) as appliance:
        seen = policies(appliance)
    assert seen == {
        "main": {os.SCHED_OTHER},
        "zmq io": {os.SCHED_BATCH},
        "grpc": {os.SCHED_BATCH},
    }


def test_by_default_every_thread_keeps_the_default_policy() -> None:
    with running(demo_models("echo")) as appliance:
        seen = policies(appliance)
    assert seen == {"main": {os.SCHED_OTHER}, "zmq io": {os.SCHED_OTHER}, "grpc": {os.SCHED_OTHER}}
