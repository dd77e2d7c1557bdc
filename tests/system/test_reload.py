"""Reload: models change under load without a failed request."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
import tomli_w

from appliance.errors import ApplianceError, ModelNotFound
from appliance.processes.control import ControlError
from tests.system import traffic
from tests.system.harness import Appliance, demo_models, running


def tagged(tag: str, instances: int = 1) -> dict[str, Any]:
    return {
        "name": "tagged",
        "class": "tests.models:Tagged",
        "instances": instances,
        "options": {"tag": tag, "delay_s": 0.002},
    }


def rewrite(appliance: Appliance, models: list[dict[str, Any]]) -> None:
    path = appliance.run_dir / "config.toml"
    import tomllib

    config = tomllib.loads(path.read_text())
    config["models"] = models
    path.write_text(tomli_w.dumps(config))


def wait_reloaded(appliance: Appliance, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if appliance.ctl("status")["reloading"] is None:
            return
        time.sleep(0.1)
    raise AssertionError("reload did not finish")


class Load(traffic.Background):
    """Threads calling ``tagged`` in a loop, counting tags and failures."""

    def __init__(self, appliance: Appliance, threads: int = 3) -> None:
        super().__init__()
        self.client = appliance.client()
        self.tags: Counter[str] = Counter()
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self.loop) for _ in range(threads)]

    def loop(self) -> None:
        x = np.arange(4, dtype=np.float32)
        while not self.stop.is_set():
            try:
                with self.client.infer("tagged", {"x": x}, timeout_s=10) as result:
                    self.tags[result.array("tag")[0].decode()] += 1
            except ApplianceError as ex:
                self.failures.append(repr(ex))


def test_changed_added_and_removed_models_swap_under_load() -> None:
    with running([tagged("old", instances=2), *demo_models("echo")]) as appliance:
        old_pids = {p["pid"] for p in appliance.processes() if p["model"] == "tagged"}
        with Load(appliance) as load:
            time.sleep(0.5)
            rewrite(appliance, [tagged("new", instances=2), *demo_models("forward")])
            summary = appliance.ctl("reload")
            assert summary["changed"] == ["tagged"]
            assert summary["added"] == ["forward"]
            assert summary["removed"] == ["echo"]
            wait_reloaded(appliance)
            time.sleep(0.5)
        assert load.failures == []
        assert load.tags["old"] > 0
        assert load.tags["new"] > 0
        client = appliance.client()
        assert client.models() == ["tagged", "forward"]
        with client.infer("forward", {"x": np.array([[2.0]])}) as result:
            assert result.array("y").tolist() == [[4.0]]
        with pytest.raises(ModelNotFound):
            client.infer("echo", {"x": np.zeros(1)})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the old instances drain, then exit
            processes = appliance.processes()
            pids = {p["pid"] for p in processes if p["model"] in ("tagged", "echo")}
            if pids.isdisjoint(old_pids) and len(pids) == 2:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"old instances still running: {processes}")
        appliance.remember_pids()


def test_a_bad_config_is_refused_and_sighup_reloads() -> None:
    with running([tagged("one")]) as appliance:
        path = appliance.run_dir / "config.toml"
        good = path.read_text()
        path.write_text(good + "\n[[models]]\nname = 'broken'\n")
        with pytest.raises(ControlError, match=r"models\[1\]\.class: missing"):
            appliance.ctl("reload")
        client = appliance.client()
        with client.infer("tagged", {"x": np.zeros(1, np.float32)}) as result:
            assert result.array("tag")[0] == b"one"
        path.write_text(good)
        rewrite(appliance, [tagged("two")])
        appliance.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with client.infer("tagged", {"x": np.zeros(1, np.float32)}) as result:
                if result.array("tag")[0] == b"two":
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("SIGHUP did not reload")
        assert "reload: 0 added, 1 changed" in appliance.log()
        appliance.remember_pids()


def test_unload_and_load_a_model_at_run_time() -> None:
    with running([tagged("one"), *demo_models("echo")]) as appliance:
        client = appliance.client()
        client.unload_model("echo")
        with pytest.raises(ModelNotFound):
            client.infer("echo", {"x": np.zeros(1)})
        status = appliance.ctl("status")
        assert status["models"] == ["tagged"]
        assert status["unloaded"] == ["echo"]
        with client.infer("tagged", {"x": np.zeros(1, np.float32)}) as result:
            assert result.array("tag")[0] == b"one"
        client.load_model("echo")
        with client.infer("echo", {"x": np.arange(2)}) as result:
            assert result.array("x").tolist() == [0, 1]
        assert appliance.ctl("status")["unloaded"] == []
        with pytest.raises(ControlError, match="failed to load: model 'nope'"):
            client.load_model("nope")
        with pytest.raises(ControlError, match="failed to unload"):
            client.unload_model("nope")
        appliance.remember_pids()
