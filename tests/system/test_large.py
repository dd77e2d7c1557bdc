"""Tensors larger than a ring, and the limits that bound shared memory."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.errors import TooLarge
from tests.system.harness import demo_models, running

MiB = 1 << 20


def test_tensors_larger_than_the_rings_and_ring_reuse() -> None:
    shm = {
        "request_ring_bytes": 1 * MiB,
        "response_ring_bytes": 1 * MiB,
        "max_tensor_bytes": 20 * MiB,
        "spill_limit_bytes": 40 * MiB,
    }
    with running(demo_models("identity", "echo"), shm=shm) as appliance:
        client = appliance.client()
        rng = np.random.default_rng(0)
        # 16 MiB: sixteen times either ring, so it goes to one-off segments both ways.
        big = rng.random((4 * MiB,), dtype=np.float32).reshape(1024, -1)
        with client.infer("identity", {"INPUT0": big}) as result:
            np.testing.assert_array_equal(result.array("OUTPUT0"), big)
        # Many requests that each fill half a ring: space must come back every time.
        half = rng.random((MiB // 8,), dtype=np.float32).reshape(1, -1)
        for _ in range(50):
            with client.infer("identity", {"INPUT0": half}) as result:
                np.testing.assert_array_equal(result.array("OUTPUT0"), half)
        with pytest.raises(TooLarge, match=r"shm.max_tensor_bytes"):
            client.infer("identity", {"INPUT0": np.zeros((6 * MiB,), np.float32).reshape(1, -1)})
        # The appliance keeps serving, and no one-off segment is left behind.
        with client.infer("echo", {"x": np.arange(3)}) as result:
            assert result.array("x").tolist() == [0, 1, 2]
        assert not [name for name in appliance.segments() if "-x" in name]


def test_held_results_stay_intact_while_the_rings_are_reused() -> None:
    """With and without pass-through, a result's views survive later requests."""
    models = [
        {"name": "identity", "class": "appliance.demos.identity:Identity"},
        {"name": "copying", "class": "appliance.demos.identity:Identity", "passthrough": False},
    ]
    shm = {"request_ring_bytes": 1 * MiB, "response_ring_bytes": 1 * MiB}
    with running(models, shm=shm) as appliance:
        client = appliance.client()
        rng = np.random.default_rng(3)
        for model in ("identity", "copying"):
            first = rng.random((1, 64 << 10), dtype=np.float32)  # 256 KiB
            held = client.infer(model, {"INPUT0": first})
            for _ in range(12):  # three times the ring's size
                other = rng.random((1, 64 << 10), dtype=np.float32)
                with client.infer(model, {"INPUT0": other}) as result:
                    np.testing.assert_array_equal(result.array("OUTPUT0"), other)
            np.testing.assert_array_equal(held.array("OUTPUT0"), first)
            held.release()
