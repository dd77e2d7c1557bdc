"""Requests from several processes are batched together and split back exactly."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import tritonclient.grpc as grpcclient

from appliance.client.api import ModelClient
from appliance.core.status import Counter, Role
from tests.system.harness import ROOT, Appliance, counted, eventually, running


def probe_call(appliance: Appliance, index: int, **parameters: Any) -> int:
    """One KServe gRPC call to ``probe``; returns the rows of the batch it ran in."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        x = np.full((1, 4), index, dtype=np.float32)
        value = grpcclient.InferInput("x", [1, 4], "FP32")
        value.set_data_from_numpy(x)
        result = client.infer("probe", [value], parameters=parameters, client_timeout=60)
        assert (result.as_numpy("y") == 2 * x).all()
        return int(result.as_numpy("batch")[0, 0])
    finally:
        client.close()


def test_concurrent_clients_share_batches_and_get_their_own_rows() -> None:
    models = [
        {
            "name": "probe",
            "class": "tests.models:BatchProbe",
            "max_queue_delay_ms": 20.0,
            "options": {"delay_s": 0.01},
        }
    ]
    with running(models) as appliance:
        clients = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.system.probe_client",
                    str(appliance.run_dir),
                    "40",
                    str(seed),
                ],
                stdout=subprocess.PIPE,
                cwd=ROOT,
            )
            for seed in range(3)
        ]
        try:
            outputs = [process.communicate(timeout=120)[0] for process in clients]
        finally:
            for process in clients:
                process.kill()
                process.wait()
        assert all(process.returncode == 0 for process in clients)
        summaries = [orjson.loads(output) for output in outputs]
        assert sum(s["ok"] for s in summaries) == 120
        assert max(s["max_batch"] for s in summaries) > 4  # rows of several requests
        counters = counted(appliance.client(), "probe", 120)
        assert counters[Counter.SUCCESS] == 120
        assert counters[Counter.BATCHES] < 120
        assert counters[Counter.BATCH_ROWS] >= 120


def test_grpc_calls_in_flight_are_not_capped_by_its_threads() -> None:
    """Twelve concurrent KServe gRPC calls reach the model together: one batch, not six."""
    models = [
        {
            "name": "probe",
            "class": "tests.models:BatchProbe",
            "max_queue_delay_ms": 500.0,
            "options": {"delay_s": 0.05},
        }
    ]
    calls = 12
    with running(models, grpc={"threads": 2}) as appliance, ThreadPoolExecutor(calls) as pool:
        batches = list(pool.map(lambda index: probe_call(appliance, index), range(calls)))
    assert max(batches) > 2, f"batch sizes {batches}: no more calls in flight than grpc.threads"


def frontends_in_flight(client: ModelClient) -> int:
    """Requests the frontend processes have sent to models and not had answered."""
    status = client.status
    return sum(
        info.depth
        for info in (status.read(slot) for slot in range(status.n_slots))
        if info.role in (Role.GRPC, Role.HTTP_WORKER, Role.MIP)
    )


def test_batching_is_natural_a_lone_request_runs_and_arrivals_form_the_next_batch(
    tmp_path: Path,
) -> None:
    """No queue delay configured: the first request runs alone at once, and the
    three that arrive while it runs are answered as one batch after it."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold").touch()
    models = [{"name": "probe", "class": "tests.models:BatchProbe", "options": {"gate": str(gate)}}]
    with running(models) as appliance, ThreadPoolExecutor(4) as pool:
        client = appliance.client()
        first = pool.submit(probe_call, appliance, 0, hold=True)
        assert eventually(lambda: (gate / "running").exists(), 30), "the lone request never ran"
        rest = [pool.submit(probe_call, appliance, index) for index in (1, 2, 3)]
        assert eventually(lambda: frontends_in_flight(client) == 4, 30)
        # Sent is not yet received: give ZeroMQ a moment to reach the worker's socket.
        time.sleep(0.3)
        (gate / "hold").unlink()
        assert first.result(timeout=60) == 1
        assert [call.result(timeout=60) for call in rest] == [3, 3, 3]
        counters = counted(client, "probe", 4)
        assert counters[Counter.SUCCESS] == 4
        assert counters[Counter.BATCHES] == 2
        assert counters[Counter.BATCH_ROWS] == 4
