"""What bench_models.py measures over the wire: cold and warm calls, and reading a large host.

Apart from the benchmark's runs because these are the requests alone, the
same against either server: the first KServe REST call to models never
called (cold) against warm ones, and, with LARGE models, what /metrics, the
dashboard, ``ctl status`` and a repository scan cost.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from appliance.config.reader import load
from bench.model_folders import REPOSITORY
from tests.system.harness import Appliance

COLD_SAMPLES = 5
# From this many models, a run also measures what reading the host's state costs.
LARGE = 200
WARM_CALLS = 20
SIMPLE_BODY = {
    "inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
}
DIGITS_BODY = {
    "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]
}


def latencies(base: str, models: list[tuple[str, str]]) -> dict[str, Any]:
    """First calls to models never called (ms, by kind), then warm calls to one of them."""
    bodies = {"simple": SIMPLE_BODY, "onnx": DIGITS_BODY, "torch": DIGITS_BODY}
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for name, kind in models:
        by_kind.setdefault(kind, []).append((name, kind))
    cold: dict[str, list[float]] = {}
    with requests.Session() as session:
        # The connection is open before the clock runs: cold means the model, not TCP.
        session.get(f"{base}/v2/health/live", timeout=30)
        for kind, named in by_kind.items():
            for name, _kind in named[:COLD_SAMPLES]:
                cold.setdefault(kind, []).append(call(session, base, name, bodies[kind]))
        name, kind = models[0]
        warm = [call(session, base, name, bodies[kind]) for _ in range(WARM_CALLS)]
    return {
        "cold_ms": {kind: statistics.median(values) for kind, values in cold.items()},
        "cold_samples_ms": cold,
        "warm_ms": statistics.median(warm),
    }


def call(session: requests.Session, base: str, model: str, body: dict[str, Any]) -> float:
    began = time.perf_counter()
    reply = session.post(f"{base}/v2/models/{model}/infer", json=body, timeout=120)
    elapsed = (time.perf_counter() - began) * 1000
    if reply.status_code != 200:
        raise RuntimeError(f"{model}: HTTP {reply.status_code}: {reply.text[:200]}")
    return elapsed


def large_config(appliance: Appliance, base: str, models: list[tuple[str, str]]) -> dict[str, Any]:
    """What reading the state of a host with many models costs, once each model was called
    over KServe REST: /metrics (the first scrape of a worker, then later ones), the
    dashboard's state, ``ctl status`` (its reply, and the text), and a scan of a model
    repository of as many directories."""
    with requests.Session() as session:
        for name, kind in models:
            if kind == "simple":
                call(session, base, name, SIMPLE_BODY)
        time.sleep(2.5)  # the workers publish their counters
        scrapes = []
        for _ in range(6):
            began = time.perf_counter()
            reply = session.get(f"{base}/metrics", timeout=60)
            scrapes.append((time.perf_counter() - began) * 1000)
        size = len(reply.content)
        dashboard = []
        for _ in range(5):
            began = time.perf_counter()
            session.get(f"{base}/dashboard/state", timeout=60).raise_for_status()
            dashboard.append((time.perf_counter() - began) * 1000)
    replies = []
    for _ in range(5):
        began = time.perf_counter()
        appliance.ctl("status")
        replies.append((time.perf_counter() - began) * 1000)
    began = time.perf_counter()
    text = subprocess.run(
        [sys.executable, "-m", "appliance", "ctl", "--socket", str(appliance.control), "status"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    ctl_ms = (time.perf_counter() - began) * 1000
    with tempfile.TemporaryDirectory(prefix="bench-models-scan-") as where:
        for index in range(len(models)):
            shutil.copytree(REPOSITORY / "digits_onnx", Path(where, f"d{index}"))
        config = Path(where, "config.toml")
        config.write_text(f'[[repositories]]\npath = "{where}"\n')
        scans = []
        for _ in range(5):
            began = time.perf_counter()
            scanned = load(config)
            scans.append((time.perf_counter() - began) * 1000)
    assert len(scanned.models) == len(models)
    return {
        "metrics_first_ms": scrapes[0],
        "metrics_ms": statistics.median(scrapes[1:]),
        "metrics_bytes": size,
        "dashboard_state_ms": statistics.median(dashboard),
        "ctl_status_reply_ms": statistics.median(replies),
        "ctl_status_command_ms": ctl_ms,
        "ctl_status_lines": len(text.splitlines()),
        "repository_scan_ms": statistics.median(scans),
    }
