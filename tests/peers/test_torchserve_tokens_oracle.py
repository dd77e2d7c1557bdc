"""TorchServe's token authorization on both servers: which key opens which API, and the token API.

Real TorchServe 0.12 and the appliance each serve the same model store with
token authorization on (their default), each writing its own ``key_file.json``
where it started. The same calls, each with the server's own key of the kind
named, must be answered alike: status, content type and body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from bench.servers import PeerUnavailable
from bench.torchserve_peer import torchserve
from tests.system.model_store import serving_model_store
from tests.torchserve_models import ECHO_HANDLER, write_mar

pytestmark = pytest.mark.peers

TIMEOUT = 60
# (what, port, method, path, which key: "inference", "management", "API", None or "wrong")
CALLS = [
    ("predict, no key", "inference", "POST", "/predictions/echo", None),
    ("predict, a wrong key", "inference", "POST", "/predictions/echo", "wrong"),
    ("predict, inference key", "inference", "POST", "/predictions/echo", "inference"),
    ("predict, management key", "inference", "POST", "/predictions/echo", "management"),
    ("predict, API key", "inference", "POST", "/predictions/echo", "API"),
    ("models, no key", "management", "GET", "/models", None),
    ("models, inference key", "management", "GET", "/models", "inference"),
    ("models, management key", "management", "GET", "/models", "management"),
    ("models, API key", "management", "GET", "/models", "API"),
    ("token, no key", "management", "GET", "/token?type=inference", None),
    ("token, management key", "management", "GET", "/token?type=inference", "management"),
    ("token, no type", "management", "GET", "/token", "API"),
    ("token, another type", "management", "GET", "/token?type=metrics", "API"),
    ("token, inference", "management", "GET", "/token?type=inference", "API"),
    ("predict, the old inference key", "inference", "POST", "/predictions/echo", "old inference"),
    ("predict, the new inference key", "inference", "POST", "/predictions/echo", "inference"),
    ("token, management by POST", "management", "POST", "/token?type=management", "API"),
    ("models, the old management key", "management", "GET", "/models", "old management"),
    ("models, the new management key", "management", "GET", "/models", "management"),
]
# Answered alike in status alone (the bodies are each server's own metrics).
OPEN = [("metrics, no key", "metrics", "GET", "/metrics", None)]


# Where the appliance answers otherwise on purpose (docs/models/torchserve.md lists these).
ON_PURPOSE = {
    "predict, inference key": "a handler's answer with no content type is application/json",
    "predict, the new inference key": "a handler's answer with no content type is application/json",
}


class Server:
    def __init__(self, urls: dict[str, str], key_file: Path) -> None:
        self.urls = urls
        self.key_file = key_file
        self.old: dict[str, str] = {}

    def key(self, which: str | None) -> dict[str, str]:
        if which is None:
            return {}
        if which == "wrong":
            return {"Authorization": "Bearer wrong-key"}
        if which.startswith("old "):
            return {"Authorization": f"Bearer {self.old[which[4:]]}"}
        return {"Authorization": f"Bearer {json.loads(self.key_file.read_text())[which]['key']}"}

    def call(self, port: str, method: str, path: str, which: str | None) -> tuple[int, str, str]:
        keys = json.loads(self.key_file.read_text())
        before = {kind: keys[kind]["key"] for kind in ("inference", "management")}
        answer = requests.request(
            method, self.urls[port] + path, data=b"x", headers=self.key(which), timeout=TIMEOUT
        )
        keys = json.loads(self.key_file.read_text())
        for kind, key in before.items():
            if keys[kind]["key"] != key:
                self.old[kind] = key
        kind = answer.headers.get("content-type", "").split(";")[0]
        return answer.status_code, kind, answer.text


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    store = tmp_path_factory.mktemp("model-store")
    write_mar(store, "echo", ECHO_HANDLER)
    workdir = tmp_path_factory.mktemp("workdir")
    try:
        peer = torchserve(store, ["echo.mar"], token_auth=True)
        real = peer.__enter__()
    except PeerUnavailable as ex:
        pytest.skip(f"real TorchServe is not available here: {ex}")
    try:
        theirs = Server(real.urls, Path(real.details["tmpdir"]) / "key_file.json")
        with serving_model_store(store, ["echo.mar"], token_auth=True, cwd=workdir) as ours:
            base = "http://127.0.0.1:{}"
            urls = {
                "inference": base.format(ours.ports["http"]),
                "management": base.format(ours.ports["management"]),
                "metrics": base.format(ours.ports["metrics"]),
            }
            yield {"torchserve": theirs, "appliance": Server(urls, workdir / "key_file.json")}
    finally:
        peer.__exit__(None, None, None)


def test_each_key_opens_what_torchserve_s_opens_and_the_token_api_renews_them(
    servers: dict[str, Server],
) -> None:
    for what, port, method, path, which in CALLS:
        theirs = servers["torchserve"].call(port, method, path, which)
        ours = servers["appliance"].call(port, method, path, which)
        if what in ON_PURPOSE:
            assert (ours[0], ours[2]) == (theirs[0], theirs[2]), what
            continue
        assert ours == theirs, what
    for what, port, method, path, which in OPEN:
        theirs = servers["torchserve"].call(port, method, path, which)
        ours = servers["appliance"].call(port, method, path, which)
        assert ours[0] == theirs[0] == 200, what


def test_the_key_files_say_the_same(servers: dict[str, Server]) -> None:
    def shape(server: Server) -> dict[str, list[str]]:
        return {
            kind: sorted(entry) for kind, entry in json.loads(server.key_file.read_text()).items()
        }

    assert shape(servers["appliance"]) == shape(servers["torchserve"])
    for server in servers.values():
        assert server.key_file.stat().st_mode & 0o077 == 0
