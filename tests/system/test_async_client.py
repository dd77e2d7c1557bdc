"""The client API from an event loop: many requests at once, deadlines, worker death."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time

import numpy as np
import pytest

from appliance.client.api import ModelClient
from appliance.errors import DeadlineExceeded, WorkerLost
from tests.system.harness import demo_models, running


async def many(client: ModelClient, count: int) -> list[list[int]]:
    async def one(value: int) -> list[int]:
        x = np.full((1, 16), value, dtype=np.int32)
        with await client.infer_async("simple", {"INPUT0": x, "INPUT1": x}) as result:
            return result.array("OUTPUT0")[0, :2].tolist()

    return await asyncio.gather(*(one(i) for i in range(count)))


def test_infer_async_answers_each_request_and_fails_fast() -> None:
    slow = {"name": "slow", "class": "tests.models:Slow"}
    with running([*demo_models("simple"), slow]) as appliance:
        client = appliance.client()
        results = asyncio.run(many(client, 50))
        assert results == [[2 * i, 2 * i] for i in range(50)]

        async def late() -> None:
            await client.infer_async(
                "slow", {"x": np.zeros(1, np.float32)}, parameters={"sleep_s": 2}, timeout_s=0.2
            )

        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            asyncio.run(late())
        assert time.monotonic() - started < 1.0

        async def queued() -> list[float]:
            begun = time.monotonic()

            async def one() -> float:
                x = {"x": np.zeros(1, np.float32)}
                with await client.infer_async("slow", x, parameters={"sleep_s": 0.15}):
                    return time.monotonic() - begun

            return await asyncio.gather(*(one() for _ in range(3)))

        # Three requests queued for one slow instance: each reply comes as its request
        # is done, none held back for the next (the worker holds replies only for fast ones).
        done = sorted(asyncio.run(queued()))
        gaps = [later - earlier for earlier, later in itertools.pairwise(done)]
        assert [gap > 0.1 for gap in gaps] == [True, True], done

        victim = appliance.pid_of("model[slow#0]")

        async def killed() -> None:
            call = asyncio.ensure_future(
                client.infer_async(
                    "slow", {"x": np.zeros(1, np.float32)}, parameters={"sleep_s": 30}
                )
            )
            await asyncio.sleep(0.3)
            os.kill(victim, signal.SIGKILL)
            await asyncio.wait_for(call, 5)

        with pytest.raises(WorkerLost):
            asyncio.run(killed())
