"""The dashboard's pure parts: the first render and the traffic totals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from appliance.client import traffic
from appliance.errors import ErrorCode
from appliance.observability.metrics import PROTOCOL, record_call
from appliance.protocols.dashboard import html

ROOT = Path(__file__).resolve().parents[2]


def state(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "time_ms": 1_700_000_000_000,
        "online": True,
        "draining": False,
        "ready": True,
        "master": {
            "tree": "abc",
            "pid": 7,
            "uptime_s": 4000.0,
            "requests_per_s": 1.5,
            "reloading": None,
            "ports": {"http": 8000, "grpc": 8001},
        },
        "models": [
            {
                "name": "simple",
                "ready": True,
                "why": "",
                "instances": [{"instance": 0, "pid": 9, "state": "ready", "depth": 0}],
                "success": 10,
                "fail": 0,
                "batches": 5,
                "rows": 10,
                "queue_ns": 2_000_000,
                "compute_ns": 5_000_000,
                "last_inference_ms": 0,
            }
        ],
        "unloaded": [],
        "processes": [
            {
                "pid": 7,
                "role": "master",
                "model": "",
                "state": "running",
                "restarts": 0,
                "rss_bytes": 36e6,
                "cpu_percent": 0.5,
            }
        ],
        "traffic": {"bounds": [0.1, None], "models": {}, "protocols": {}},
    }
    base.update(changes)
    return base


def test_the_first_render_has_the_tables_and_nothing_from_elsewhere() -> None:
    page = html.render(state())
    assert "<td>simple</td>" in page
    assert "<td>1/1 ready</td>" in page
    assert "<td>0.20</td>" in page  # queue ms per request
    assert "<td>36.0 MB</td>" in page
    assert "tree abc · master pid 7 · up 67 min · http 8000 · grpc 8001" in page
    assert "class='badge ok'>online, ready<" in page
    assert "Take offline" in page
    for outside in ("http://", "https://", " src=", "<link"):
        assert outside not in page
    assert html.STATE_PATH in page


def test_text_from_the_host_is_escaped_everywhere() -> None:
    hostile = "</script><!--<script>alert(1)</script>"
    processes = [{"pid": 1, "role": hostile, "model": "", "state": "ready"}]
    models = [dict(state()["models"][0], why=hostile)]
    page = html.render(state(processes=processes, models=models))
    assert "<script>alert" not in page
    assert page.count("</script>") == 2  # the initial state and the script
    start = page.index("type='application/json'>") + len("type='application/json'>")
    initial = orjson.loads(page[start : page.index("</script>", start)])
    assert initial["models"][0]["why"] == hostile


@pytest.mark.parametrize(
    ("online", "ready", "draining", "label", "kind"),
    [
        (True, True, False, "online, ready", "ok"),
        (True, False, False, "online, not ready", "warn"),
        (False, True, True, "offline, ready, draining", "off"),
    ],
)
def test_the_badge_says_online_ready_draining(
    online: bool, ready: bool, draining: bool, label: str, kind: str
) -> None:
    assert html.state_label(state(online=online, ready=ready, draining=draining)) == (label, kind)


def test_unloaded_models_are_listed() -> None:
    assert "<td>gone</td><td>unloaded</td>" in html.render(state(unloaded=["gone"]))


def test_without_the_master_the_page_says_so() -> None:
    page = html.render(state(master=None))
    assert "master not answering" in page


def test_traffic_reads_this_process_s_calls_when_not_in_a_tree() -> None:
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    before = traffic.read()["models"].get("unit-dash", {"ok": 0.0, "fail": 0.0, "count": 0.0})
    token = PROTOCOL.set("unit")
    try:
        started = time.perf_counter()
        record_call("unit-dash", ErrorCode.OK, started)
        record_call("unit-dash", ErrorCode.OK, started)
        record_call("unit-dash", ErrorCode.MODEL_FAILED, started)
        record_call("nobody-knows", ErrorCode.MODEL_NOT_FOUND, started)
    finally:
        PROTOCOL.reset(token)
    totals = traffic.read()
    model = totals["models"]["unit-dash"]
    assert model["ok"] - before["ok"] == 2
    assert model["fail"] - before["fail"] == 1
    assert model["count"] - before["count"] == 3
    assert model["buckets"][-1] == model["count"]
    assert model["buckets"] == sorted(model["buckets"])
    assert totals["bounds"][-1] is None
    assert totals["bounds"][:-1] == sorted(totals["bounds"][:-1])
    assert traffic.UNKNOWN_MODEL in totals["models"]
    assert "nobody-knows" not in totals["models"]
    assert totals["protocols"]["unit"] >= 4


RECORD = """
import time
from appliance.errors import ErrorCode
from appliance.observability.metrics import PROTOCOL, record_call
PROTOCOL.set("{protocol}")
for _ in range({count}):
    record_call("m", ErrorCode.OK, time.perf_counter())
"""


def test_traffic_adds_up_every_process_of_a_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for protocol, count in (("kserve", 3), ("grps", 2), ("kserve", 4)):
        code = RECORD.format(protocol=protocol, count=count)
        subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True, timeout=60)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    totals = traffic.read()
    assert totals["protocols"] == {"kserve": 7.0, "grps": 2.0}
    assert totals["models"]["m"]["ok"] == 9
    assert totals["models"]["m"]["count"] == 9
    assert totals["models"]["m"]["buckets"][-1] == 9
