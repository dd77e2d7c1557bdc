"""New requests wait out a model worker's restart instead of failing at once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from appliance.client.api import ModelClient
from appliance.errors import ModelNotReady
from tests.system.harness import Appliance, demo_models, eventually, running

MODELS = [
    {"name": "slow", "class": "tests.models:Slow"},
    {"name": "impatient", "class": "tests.models:Slow", "restart_wait_s": 0.0},
    *demo_models("echo", "forward"),
]
X = np.arange(4, dtype=np.float32)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(MODELS) as started:
        yield started


def kill_and_see_not_ready(appliance: Appliance, client: ModelClient, model: str) -> int:
    """Kill -9 the model's one worker; return once readiness says it is not ready."""
    victim = appliance.pid_of(f"model[{model}#0]")
    os.kill(victim, signal.SIGKILL)
    assert eventually(lambda: not client.model_ready(model), 10.0, interval_s=0.002)
    return victim


def test_a_request_during_a_restart_waits_and_is_answered(appliance: Appliance) -> None:
    client = appliance.client()
    victim = kill_and_see_not_ready(appliance, client, "slow")
    with client.infer("slow", {"x": X}) as result:
        assert result.array("y").tolist() == X.tolist()
    assert appliance.pid_of("model[slow#0]") != victim
    appliance.remember_pids()


def test_async_calls_and_streams_wait_the_same(appliance: Appliance) -> None:
    client = appliance.client()

    async def call() -> list[float]:
        with await client.infer_async("slow", {"x": X}) as result:
            return [float(v) for v in result.array("y")]

    kill_and_see_not_ready(appliance, client, "slow")
    assert asyncio.run(call()) == X.tolist()
    kill_and_see_not_ready(appliance, client, "echo")
    parts = [part.array("x").tolist() for part in client.stream("echo", {"x": np.arange(3)})]
    assert parts == [[0], [1], [2]]  # echo streams its input back in 3 parts
    appliance.remember_pids()


def test_umbridge_evaluations_wait_too(appliance: Appliance) -> None:
    client = appliance.client()
    kill_and_see_not_ready(appliance, client, "forward")
    response = requests.post(
        f"http://127.0.0.1:{appliance.ports['http']}/Evaluate",
        json={"name": "forward", "input": [[3.0]], "config": {}},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["output"] == [[6.0]]
    appliance.remember_pids()


def test_the_wait_ends_at_the_deadline_or_restart_wait_s_with_not_ready(
    appliance: Appliance,
) -> None:
    client = appliance.client()
    kill_and_see_not_ready(appliance, client, "impatient")
    with pytest.raises(ModelNotReady, match="model impatient has no ready instance"):
        client.infer("impatient", {"x": X})
    assert eventually(lambda: client.model_ready("impatient"), 30.0)
    kill_and_see_not_ready(appliance, client, "slow")
    started = time.monotonic()
    with pytest.raises(ModelNotReady, match="model slow has no ready instance"):
        client.infer("slow", {"x": X}, timeout_s=0.001)
    assert time.monotonic() - started < 1.0
    assert eventually(lambda: client.model_ready("slow"), 30.0)
    appliance.remember_pids()
