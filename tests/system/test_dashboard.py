"""The dashboard at GET /, in a real headless chromium (Debian's), under load."""

from __future__ import annotations

import http.client
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient

from tests.system.browser import CHROMIUM, Browser, chromium
from tests.system.harness import Appliance, demo_models, running

MODELS = ["simple", "echo", "forward"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium: apt-get install chromium")


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    models = demo_models(*MODELS, simple={"instances": 2})
    with running(models, http={"workers": 2}, server={"default_model": "echo"}) as app:
        yield app


@pytest.fixture(scope="module")
def page(appliance: Appliance) -> Iterator[Browser]:
    with chromium() as browser:
        browser.open(f"http://127.0.0.1:{appliance.ports['http']}/")
        yield browser


def fetch(
    appliance: Appliance, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", appliance.ports["http"], timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


class KServeLoad:
    """A KServe REST client calling ``simple`` in a loop, in a thread."""

    def __init__(self, appliance: Appliance) -> None:
        self.url = f"127.0.0.1:{appliance.ports['http']}"
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self.loop)

    def loop(self) -> None:
        client = httpclient.InferenceServerClient(self.url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        try:
            while not self.stop.is_set():
                try:
                    client.infer("simple", inputs)
                except Exception as ex:
                    self.failures.append(repr(ex))
                time.sleep(0.002)  # leave the 2-core test machine some air
        finally:
            client.close()

    def __enter__(self) -> KServeLoad:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def table(browser: Browser, body_id: str) -> list[list[str]]:
    rows: list[list[str]] = browser.evaluate(
        f"[...document.getElementById('{body_id}').rows]"
        ".map((r) => [...r.cells].map((c) => c.textContent))"
    )
    return rows


def simple_calls(browser: Browser) -> int:
    row = next(row for row in table(browser, "models") if row[0] == "simple")
    return int(row[-2])


def test_the_page_shows_models_processes_and_loads_nothing_from_elsewhere(
    appliance: Appliance, page: Browser
) -> None:
    assert page.evaluate("document.title") == "appliance"
    assert [row[0] for row in table(page, "models")] == MODELS
    simple = next(row for row in table(page, "models") if row[0] == "simple")
    assert simple[1] == "ready"
    assert simple[2].startswith("2/2 ready")
    roles = {row[1] for row in table(page, "processes")}
    assert {"master", "http", "http worker", "grpc[0]", "mip[0]", "model[simple#1]"} <= roles
    assert "online, ready" in page.evaluate("document.getElementById('badge').textContent")
    # Every resource the page fetched (its polls) came from the appliance itself.
    origin = f"http://127.0.0.1:{appliance.ports['http']}/"
    page.wait_for("performance.getEntriesByType('resource').length > 0")
    urls = page.evaluate("performance.getEntriesByType('resource').map((e) => e.name)")
    assert all(url.startswith(origin) for url in urls), urls
    status, content_type, body = fetch(appliance, "GET", "/", Accept="text/html")
    assert status == 200
    assert content_type.startswith("text/html")
    for outside in (b"https://", b"http://", b" src="):
        assert outside not in body


def test_its_numbers_and_charts_move_under_load(
    appliance: Appliance, page: Browser, tmp_path: Path
) -> None:
    before = simple_calls(page)
    with KServeLoad(appliance) as load:
        # The page refreshes itself (no reload): its figures follow the traffic.
        page.wait_for("parseFloat(document.getElementById('rps').textContent) > 0")
        first = simple_calls(page)
        page.wait_for(
            "[...document.getElementById('models').rows].some((r) => "
            f"r.cells[0].textContent === 'simple' && +r.cells[10].textContent > {first})"
        )
        page.wait_for("document.querySelectorAll('#chart-rate polyline').length > 0")
        page.wait_for(
            "document.querySelector('#chart-latency polyline') !== null && "
            "document.getElementById('p99').textContent.endsWith('ms')"
        )
        time.sleep(2.5)  # a few more points, for the screenshot
        shot = tmp_path / "dashboard.png"
        page.screenshot(shot)
        keep = os.environ.get("APPLIANCE_SCREENSHOT_DIR")
        if keep:
            shutil.copy(shot, Path(keep) / "dashboard.png")
    assert load.failures == []
    assert simple_calls(page) > first > before
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    protocols = page.evaluate("document.getElementById('legend-protocol').textContent")
    assert "kserve" in protocols


def ready_status(appliance: Appliance) -> int:
    return fetch(appliance, "GET", "/v2/health/ready")[0]


def wait_status(appliance: Appliance, want: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ready_status(appliance) != want:
        assert time.monotonic() < deadline, f"readiness not {want} after {timeout_s} s"
        time.sleep(0.02)


def test_the_button_takes_the_host_out_of_rotation_and_back(
    appliance: Appliance, page: Browser
) -> None:
    page.wait_for("document.getElementById('toggle').textContent === 'Take offline'")
    try:
        page.evaluate("document.getElementById('toggle').click()")
        wait_status(appliance, 503)
        page.wait_for("document.getElementById('badge').textContent.startsWith('offline')")
        page.wait_for("document.getElementById('toggle').textContent === 'Bring online'")
        assert appliance.ctl("status")["online"] is False
        page.evaluate("document.getElementById('toggle').click()")
        wait_status(appliance, 200)
        page.wait_for("document.getElementById('badge').textContent === 'online, ready'")
    finally:
        appliance.ctl("online")


def test_json_clients_get_graphpipe_metadata_and_the_state_document(
    appliance: Appliance,
) -> None:
    status, content_type, body = fetch(appliance, "GET", "/")
    assert status == 200
    assert content_type.startswith("application/json")
    assert "Inputs" in orjson.loads(body)
    status, _, body = fetch(appliance, "GET", "/dashboard/state")
    state: dict[str, Any] = orjson.loads(body)
    assert status == 200
    assert [model["name"] for model in state["models"]] == MODELS
    assert state["master"]["ports"]["http"] == appliance.ports["http"]
    assert {"pid", "role", "rss_bytes", "cpu_percent", "restarts"} <= set(state["processes"][0])
    status, content_type, body = fetch(appliance, "GET", "/dashboard")
    assert status == 200
    assert content_type.startswith("text/html")


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b'{"online": false}', "text/plain", 415),
        (b"online=false", "application/x-www-form-urlencoded", 415),
        (b"{", "application/json", 400),
        (b'{"online": "no"}', "application/json", 400),
        (b"[false]", "application/json", 400),
    ],
)
def test_the_online_endpoint_refuses_anything_but_a_json_boolean(
    appliance: Appliance, body: bytes, content_type: str, status: int
) -> None:
    got, _, reply = fetch(
        appliance, "POST", "/dashboard/online", body, **{"Content-Type": content_type}
    )
    assert got == status, reply
    assert "error" in orjson.loads(reply)
    assert ready_status(appliance) == 200
