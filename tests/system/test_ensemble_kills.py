"""A step's worker killed mid-chain, under load: requests fail naming the step, nothing leaks.

Three steps, each its own model: the first and last copy into their
response rings, the middle one passes the first one's block on (so the
block it reads lies in another worker's ring) and takes its time, so that
requests queue there. SIGKILL of the middle step's worker fails what it
held with the step and model named; the master restarts it and the chain
serves again. Afterwards every ring (both frontends', every worker's) is
empty, and ``appliance ctl status`` and /metrics agree on the processes.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.system import traffic
from tests.system.harness import Appliance, eventually, make_config, new_run_dir, serving
from tests.system.test_metrics import scrape, value

STEP = "tests.models:Slow"
MODELS: list[dict[str, Any]] = [
    {"name": "step_a", "class": STEP, "passthrough": False},
    {"name": "step_b", "class": STEP, "options": {"sleep_s": 0.02}, "restart_wait_s": 10.0},
    {"name": "step_c", "class": STEP, "passthrough": False},
    {
        "name": "chain",
        "platform": "ensemble",
        "inputs": [{"name": "IN", "dtype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUT", "dtype": "FP32", "shape": [-1]}],
        "steps": [
            {"model": "step_a", "input_map": {"x": "IN"}, "output_map": {"y": "a"}},
            {"model": "step_b", "input_map": {"x": "a"}, "output_map": {"y": "b"}},
            {"model": "step_c", "input_map": {"x": "b"}, "output_map": {"y": "OUT"}},
        ],
    },
]
X = np.arange(32 * 1024, dtype=np.float32)  # 128 KiB: in the rings, not inline


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with serving(make_config(new_run_dir(), MODELS, http={"workers": 1})) as started:
        yield started


class Load(traffic.Background):
    """Threads calling the chain over KServe gRPC and REST until stopped."""

    JOIN_S = 60.0

    def __init__(self, app: Appliance) -> None:
        super().__init__()
        self.app = app
        self.ok = 0
        self.failures: list[str] = []
        self.wrong = 0
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._loop, args=(maker,), daemon=True)
            for maker in (self._grpc, self._grpc, self._rest, self._rest)
        ]

    def _grpc(self) -> tuple[Callable[[], Any], Callable[[], None]]:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.app.ports['grpc']}")

        def call() -> Any:
            tensor = grpcclient.InferInput("IN", list(X.shape), "FP32")
            tensor.set_data_from_numpy(X)
            return client.infer("chain", [tensor], client_timeout=30).as_numpy("OUT")

        return call, client.close

    def _rest(self) -> tuple[Callable[[], Any], Callable[[], None]]:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{self.app.ports['http']}")

        def call() -> Any:
            tensor = httpclient.InferInput("IN", list(X.shape), "FP32")
            tensor.set_data_from_numpy(X, binary_data=True)
            return client.infer("chain", [tensor]).as_numpy("OUT")

        return call, client.close

    def _loop(self, maker: Callable[[], tuple[Callable[[], Any], Callable[[], None]]]) -> None:
        call, close = maker()
        try:
            while not self.stop.is_set():
                try:
                    answer = call()
                except Exception as ex:
                    with self._lock:
                        self.failures.append(str(ex))
                    continue
                with self._lock:
                    if np.array_equal(answer, X):
                        self.ok += 1
                    else:
                        self.wrong += 1
        finally:
            close()


def rings_in_use(app: Appliance) -> list[tuple[str, str, float]]:
    samples = scrape(app)
    return [
        (labels["role"], labels["model"], amount)
        for labels, amount in samples["appliance_ring_used_bytes"]
        if labels["kind"] in ("used", "spilled") and amount
    ]


def test_killing_a_step_worker_mid_chain_under_load_leaks_nothing(appliance: Appliance) -> None:
    victim = appliance.pid_of("model[step_b#0]")
    with Load(appliance) as load:
        assert eventually(lambda: load.ok >= 20, 30.0), load.failures[:3]
        os.kill(victim, signal.SIGKILL)
        killed_at = load.ok
        # The master restarts it; the chain serves again.
        assert eventually(lambda: load.ok >= killed_at + 40, 60.0), load.failures[:3]
    assert load.wrong == 0
    assert load.failures, "no request was at the killed step"
    for failure in load.failures:
        assert "ensemble chain, step 1 (model step_b)" in failure, failure
    # Every ring is empty again: the frontends', and each worker's, as the
    # status table has it (ctl status's source) and as /metrics shows it.
    assert eventually(lambda: not rings_in_use(appliance), 10.0), rings_in_use(appliance)
    rows = {row["role"]: row for row in appliance.processes()}
    samples = scrape(appliance)
    restarted = rows["model[step_b#0]"]
    assert restarted["restarts"] == 1
    assert restarted["pid"] != victim
    assert value(samples, "appliance_process_restarts_total", role="model[step_b#0]") == 1
    # The same processes, by pid, on both sides: none left of the killed one.
    shown = {
        (labels["model"], int(labels["pid"]))
        for labels, _amount in samples["appliance_ring_used_bytes"]
        if labels["role"] == "model"
    }
    listed = {(row["model"], row["pid"]) for row in rows.values() if row["model"]}
    assert shown == listed
    assert victim not in {pid for _model, pid in shown}
