"""ZeroMQ's I/O threads run under SCHED_BATCH, unless server.zmq_io_batch says not.

A woken SCHED_BATCH thread never preempts the running one, so the frontend
or model worker that hands it a message finishes its turn first
(appliance/core/zmq_context.py). What a user checks: ``chrt -p`` of the I/O
threads of the processes that served a request.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from tests.system.harness import Appliance, demo_models, running

BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}


def io_thread_policies(pid: int) -> list[int]:
    """The scheduling policy of each of ``pid``'s ZeroMQ I/O threads."""
    policies = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        if Path(f"/proc/{pid}/task/{tid}/comm").read_text().startswith("ZMQbg/IO"):
            policies.append(os.sched_getscheduler(int(tid)))
    return policies


def served_one(appliance: Appliance) -> dict[str, list[int]]:
    """Answer one KServe REST request; the I/O threads' policies of the HTTP worker
    and the model worker that served it."""
    base = f"http://127.0.0.1:{appliance.ports['http']}"
    reply = requests.post(f"{base}/v2/models/echo/infer", json=BODY, timeout=30)
    assert reply.status_code == 200, reply.text
    return {
        "http worker": io_thread_policies(appliance.pid_of("http worker")),
        "model worker": io_thread_policies(appliance.pid_of("model[echo#0]")),
    }


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_io_threads_of_frontend_and_model_worker_run_sched_batch() -> None:
    with running(demo_models("echo")) as appliance:
        policies = served_one(appliance)
    assert policies["http worker"], "the HTTP worker has no ZeroMQ I/O thread"
    assert policies["model worker"], "the model worker has no ZeroMQ I/O thread"
    assert set(policies["http worker"]) == {os.SCHED_BATCH}
    assert set(policies["model worker"]) == {os.SCHED_BATCH}


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_zmq_io_batch_false_keeps_the_default_policy() -> None:
    with running(demo_models("echo"), server={"zmq_io_batch": False}) as appliance:
        policies = served_one(appliance)
    assert set(policies["http worker"]) == {os.SCHED_OTHER}
    assert set(policies["model worker"]) == {os.SCHED_OTHER}
