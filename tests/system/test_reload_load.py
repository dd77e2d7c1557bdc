"""Reload under load on every protocol: the change shows, and no request fails.

While stock clients loop over KServe REST and gRPC, GRPS REST and gRPC,
GraphPipe, UM-Bridge and MIP, the config changes the served model (one
instance to two, and its factor, so every reply shows which config served
it) and `appliance ctl reload` swaps it in.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib

import pytest
import tomli_w

from tests.system.harness import ROOT, Appliance, running
from tests.system.protocol_load import CLIENTS, SECTIONS, ProtocolLoad, scaled

# graphpipe 1.0.4 calls EndVector(n), deprecated since flatbuffers 2.0.7.
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")


def rewrite_models(app: Appliance, models: list[dict[str, object]]) -> None:
    path = app.run_dir / "config.toml"
    config = tomllib.loads(path.read_text())
    config["models"] = models
    path.write_text(tomli_w.dumps(config))


def wait_reloaded(app: Appliance, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while app.ctl("status")["reloading"] is not None:
        assert time.monotonic() < deadline, "the reload did not finish"
        time.sleep(0.05)


def test_a_reload_under_load_on_every_protocol_loses_nothing() -> None:
    with running([scaled(2.0, instances=1)], **SECTIONS) as app:
        old = {p["pid"] for p in app.processes() if p["model"] == "scaled"}
        with ProtocolLoad(app) as load:
            load.wait_each(5)
            rewrite_models(app, [scaled(3.0, instances=2)])
            reply = subprocess.run(
                [sys.executable, "-m", "appliance", "ctl", "--socket", str(app.control), "reload"],
                check=True,
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            assert "scaled" in reply.stdout, reply.stdout
            wait_reloaded(app)
            load.wait_each(5)  # every protocol, served by the new instances
        print(f"served: {dict(load.successes)}; factors seen: {load.seen}")
        assert load.failures == []
        # Each protocol saw the old model, then the new one, and never the old again.
        assert load.seen == {name: [2.0, 3.0] for name in CLIENTS}
        # Two new instances serve; the old one finishes what it holds and exits.
        deadline = time.monotonic() + 20
        while True:
            app.remember_pids()
            processes = [p for p in app.processes() if p["model"] == "scaled"]
            states = sorted(p["state"] for p in processes)
            if states == ["ready", "ready"] and old.isdisjoint(p["pid"] for p in processes):
                break
            assert time.monotonic() < deadline, f"not two new instances: {processes}"
            time.sleep(0.1)
