"""Routing across instances and processes, and deadlines."""

from __future__ import annotations

import time

import numpy as np
import pytest

from appliance.core.status import Counter
from appliance.errors import DeadlineExceeded
from tests.system.harness import running
from tests.system.test_failures import call_in_thread
from tests.system.test_health import PONG, grpc_serving, mip_ping


def test_requests_spread_over_instances_and_deadlines_hold() -> None:
    models = [{"name": "slow", "class": "tests.models:Slow", "instances": 2}]
    sections = {"grpc": {"workers": 2}, "mip": {"workers": 2}}
    with running(models, **sections) as appliance:
        client = appliance.client()
        x = np.ones(2, np.float32)
        calls = [
            call_in_thread(
                lambda: (
                    client.infer("slow", {"x": x}, parameters={"sleep_s": 0.5}).array("y").tolist()
                )
            )
            for _ in range(4)
        ]
        for thread, outcome in calls:
            thread.join(30)
            assert outcome.get("result") == [1.0, 1.0], outcome
        slots = client.router.slots["slow"]
        served = [client.status.read(slot).counters[Counter.SUCCESS] for slot in slots]
        assert all(count >= 1 for count in served), served

        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.infer("slow", {"x": x}, parameters={"sleep_s": 2.0}, timeout_s=0.3)
        assert time.monotonic() - started < 1.5
        # The late reply is absorbed; later requests are answered normally.
        for _ in range(4):
            with client.infer("slow", {"x": x}) as result:
                assert result.array("y").tolist() == [1.0, 1.0]

        # Two gRPC and two MIP processes share their ports; each answers.
        roles = {p["role"] for p in appliance.processes()}
        assert {"grpc[0]", "grpc[1]", "mip[0]", "mip[1]"} <= roles
        for _ in range(8):
            assert grpc_serving(appliance)
            assert mip_ping(appliance) == PONG
