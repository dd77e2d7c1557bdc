"""The appliance with TorchServe's own ``ts`` package installed: its classes are used as they are.

A TorchServe user may keep torchserve installed beside the appliance. Then
``import ts`` finds TorchServe's package, not the appliance's, and handlers
get TorchServe's Context, BaseHandler and envelopes, and their streamed
responses go through TorchServe's own frame writer (read back by the
appliance). Here TorchServe's ``ts`` (from bench/.peers/torchserve) is put on
the appliance's PYTHONPATH alone, and the same archives answer as they do on
the appliance's own ``ts``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from bench.servers import PeerUnavailable
from bench.torchserve_peer import torchserve_bin
from tests.system.model_store import serving_model_store
from tests.torchserve_models import (
    ECHO_HANDLER,
    LABELS,
    LABELS_HANDLER,
    RAISING_HANDLER,
    STREAM_HANDLER,
    write_mar,
)

pytestmark = pytest.mark.peers

TIMEOUT = 60
# Where the ts package handlers import comes from.
WHICH_HANDLER = """
import ts


def handle(data, context):
    if data is None:
        return None
    return [ts.__file__ for _ in data]
"""


def test_torchserve_s_own_ts_serves_the_same_archives(tmp_path: Path) -> None:
    try:
        site = next(torchserve_bin().parent.glob("lib/python*/site-packages"))
    except PeerUnavailable as ex:
        pytest.skip(f"TorchServe is not available here: {ex}")
    only_ts = tmp_path / "path"
    only_ts.mkdir()
    (only_ts / "ts").symlink_to(site / "ts")
    store = tmp_path / "store"
    write_mar(store, "echo", ECHO_HANDLER)
    write_mar(store, "labels", LABELS_HANDLER, extra_files={"labels.json": json.dumps(LABELS)})
    write_mar(store, "raising", RAISING_HANDLER)
    write_mar(store, "stream", STREAM_HANDLER)
    write_mar(store, "which", WHICH_HANDLER)
    with serving_model_store(store, env={"PYTHONPATH": str(only_ts)}) as appliance:
        base = f"http://127.0.0.1:{appliance.ports['http']}"
        found = requests.post(f"{base}/predictions/which", data=b"?", timeout=TIMEOUT).text
        assert found.startswith(str(only_ts)), found  # TorchServe's ts, not the appliance's
        labels = requests.post(f"{base}/predictions/labels", data=b"1", timeout=TIMEOUT)
        assert labels.json()["label"] == "one"
        assert requests.post(f"{base}/predictions/echo", data=b"x", timeout=TIMEOUT).content == b"x"
        failed = requests.post(
            f"{base}/predictions/raising",
            data=b"1",
            headers={"x-raise": "prediction"},
            timeout=TIMEOUT,
        )
        assert (failed.status_code, failed.json()["message"]) == (418, "told to fail")
        with requests.post(
            f"{base}/predictions/stream", data=b"x", stream=True, timeout=TIMEOUT
        ) as answer:
            arrived = [(time.monotonic(), chunk) for chunk in answer.iter_content(None)]
            assert "ts_stream_next" not in answer.headers
        assert b"".join(chunk for _, chunk in arrived) == b"part0 part1 part2 last"
        assert arrived[-1][0] - arrived[0][0] > 0.5
