"""Requests from several processes are batched together and split back exactly."""

from __future__ import annotations

import subprocess
import sys

import orjson

from appliance.core.status import Counter
from tests.system.harness import ROOT, running


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
        counters = appliance.client().counters("probe")
        assert counters[Counter.SUCCESS] == 120
        assert counters[Counter.BATCHES] < 120
        assert counters[Counter.BATCH_ROWS] >= 120


def test_grpc_calls_in_flight_are_not_capped_by_its_threads() -> None:
    """Twelve concurrent KServe gRPC calls reach the model together: one batch, not six."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import tritonclient.grpc as grpcclient

    models = [
        {
            "name": "probe",
            "class": "tests.models:BatchProbe",
            "max_queue_delay_ms": 500.0,
            "options": {"delay_s": 0.05},
        }
    ]
    calls = 12
    with running(models, grpc={"threads": 2}) as appliance:
        url = f"127.0.0.1:{appliance.ports['grpc']}"

        def call(index: int) -> int:
            client = grpcclient.InferenceServerClient(url)
            try:
                x = np.full((1, 4), index, dtype=np.float32)
                value = grpcclient.InferInput("x", [1, 4], "FP32")
                value.set_data_from_numpy(x)
                result = client.infer("probe", [value], client_timeout=60)
                assert (result.as_numpy("y") == 2 * x).all()
                return int(result.as_numpy("batch")[0, 0])
            finally:
                client.close()

        with ThreadPoolExecutor(calls) as pool:
            batches = list(pool.map(call, range(calls)))
    assert max(batches) > 2, f"batch sizes {batches}: no more calls in flight than grpc.threads"
