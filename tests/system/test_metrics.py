"""GET /metrics: Prometheus text that adds up every process of the tree."""

from __future__ import annotations

import http.client
import threading
import time

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tests.system.harness import Appliance, demo_models, eventually, running


def scrape_text(appliance: Appliance) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", appliance.ports["http"], timeout=10)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("text/plain")
        return response.read().decode()
    finally:
        conn.close()


def scrape(appliance: Appliance) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = scrape_text(appliance)
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def value(
    samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str
) -> float:
    return sum(
        v for sample_labels, v in samples.get(name, []) if labels.items() <= sample_labels.items()
    )


def test_metrics_cover_state_batches_processes_and_rings() -> None:
    models = demo_models("simple", "echo", simple={"instances": 2})
    with running(models, http={"workers": 2}) as appliance:
        client = appliance.client()
        a = np.zeros((2, 16), np.int32)
        for _ in range(10):
            client.infer("simple", {"INPUT0": a, "INPUT1": a}).release()
        # Workers publish their counters just after they answer.
        assert eventually(
            lambda: value(scrape(appliance), "appliance_batch_rows_count", model="simple") == 10,
            5.0,
        )
        samples = scrape(appliance)
        assert value(samples, "appliance_online") == 1
        assert value(samples, "appliance_ready") == 1
        assert value(samples, "appliance_model_ready", model="echo") == 1
        # Both instances' batches add up, whichever process scrapes.
        assert value(samples, "appliance_batch_rows_count", model="simple") == 10
        assert value(samples, "appliance_batch_rows_sum", model="simple") == 20
        assert value(samples, "appliance_compute_duration_seconds_count", model="simple") == 10
        roles = {labels["role"] for labels, _ in samples["appliance_process_resident_memory_bytes"]}
        assert {"master", "http", "http worker", "grpc[0]", "mip[0]", "model[simple#1]"} <= roles
        assert value(samples, "appliance_process_restarts_total", role="model[simple#0]") == 0
        assert value(samples, "appliance_ring_used_bytes", role="model", kind="capacity") > 0
        # Frontend requests are counted by protocol and status, over both workers.
        for _ in range(6):
            scrape(appliance)
        samples = scrape(appliance)
        assert (
            value(samples, "appliance_frontend_requests_total", protocol="http", status="200") >= 7
        )
        # Triton's families read the same counters, by Triton's names and labels
        # (the parser adds the "_total" that Triton's wire, and the appliance's, leave out).
        simple = {"model": "simple", "version": "1"}
        assert value(samples, "nv_inference_request_success_total", **simple) == 10
        assert value(samples, "nv_inference_count_total", **simple) == 20
        assert value(samples, "nv_inference_exec_count_total", **simple) == 10
        assert value(samples, "nv_inference_request_failure_total", reason="BACKEND", **simple) == 0
        assert value(samples, "nv_inference_compute_infer_duration_us_total", **simple) > 0
        assert value(samples, "nv_cpu_memory_total_bytes") > 0
        wire = scrape_text(appliance)
        assert '\nnv_inference_request_success{model="simple",version="1"} 10' in wire
        appliance.ctl("offline")
        assert value(scrape(appliance), "appliance_online") == 0
        appliance.ctl("online")
        assert "http model=- status=200" in appliance.log()


def test_the_ring_gauge_shows_space_coming_back_when_a_client_releases() -> None:
    # Without pass-through, identity copies its output into its own ring.
    with running(demo_models("identity", identity={"passthrough": False})) as appliance:
        client = appliance.client()
        x = np.zeros((128, 64), np.float32)  # 32 KiB: above the inline threshold

        def used() -> float:
            samples = scrape(appliance)
            return value(samples, "appliance_ring_used_bytes", model="identity", kind="used")

        result = client.infer("identity", {"INPUT0": x})
        assert eventually(lambda: used() > 0, 5.0)
        result.release()
        # No other request comes: the worker publishes what the release gave back.
        assert eventually(lambda: used() == 0, 5.0)


def test_a_busy_worker_shows_its_batches_while_the_load_lasts_and_all_once_idle() -> None:
    # One client back to back leaves the worker idle a fraction of a millisecond
    # between requests: its batch histograms still reach /metrics as it serves.
    with running(demo_models("identity")) as appliance:
        client = appliance.client()
        x = np.zeros((1, 4), np.float32)
        stop = threading.Event()
        answered = [0]

        def load() -> None:
            while not stop.is_set():
                client.infer("identity", {"INPUT0": x}).release()
                answered[0] += 1

        def batches() -> float:
            return value(scrape(appliance), "appliance_batch_rows_count", model="identity")

        thread = threading.Thread(target=load)
        thread.start()
        try:
            seen = []
            for _ in range(3):
                time.sleep(0.3)
                seen.append(batches())
        finally:
            stop.set()
            thread.join(10)
        # Written while busy (every tenth of a second), not held until the load ends.
        assert 0 < seen[0] < seen[1] < seen[2] <= answered[0]
        # Idle, the worker writes the rest: every batch shows.
        assert eventually(lambda: batches() == answered[0], 5.0)
