"""``appliance ctl`` and ensembles: status lists them, and load, unload and reload take them.

An ensemble has no process of its own: ``ctl status`` shows it apart from
the processes, ready or with the first step whose model does not serve;
``ctl unload`` stops serving it (its step models serve on), ``ctl load``
serves it again from the config file, and ``ctl reload`` picks up an
ensemble added to the config file. Each command's refusal is one line,
never a traceback.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tomli_w

from appliance.client.api import ModelClient
from appliance.processes.control import ControlError
from tests.system.harness import Appliance, eventually, running

SCALED = {"dtype": "FP32", "shape": [-1, 4]}


def scaled(name: str, factor: float) -> dict[str, Any]:
    return {"name": name, "class": "tests.models:Scaled", "options": {"factor": factor}}


def chain(name: str, *models: str) -> dict[str, Any]:
    names = ["x", *(f"t{i}" for i in range(len(models) - 1)), "y"]
    return {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": 8,
        "inputs": [{"name": "x", **SCALED}],
        "outputs": [{"name": "y", **SCALED}],
        "steps": [
            {"model": model, "input_map": {"x": names[i]}, "output_map": {"y": names[i + 1]}}
            for i, model in enumerate(models)
        ],
    }


MODELS = [scaled("doubled", 2.0), scaled("tripled", 3.0), chain("six", "doubled", "tripled")]


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(MODELS) as started:
        yield started


def ctl(appliance: Appliance, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "appliance", "ctl", "--socket", str(appliance.control)]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)


def settled(appliance: Appliance) -> bool:
    return appliance.ctl("status")["reloading"] is None


def six(client: ModelClient) -> list[float]:
    with client.infer("six", {"x": np.ones((1, 4), np.float32)}) as result:
        return [float(v) for v in result.array("y")[0]]


def row(appliance: Appliance, name: str) -> dict[str, Any] | None:
    rows = appliance.ctl("status")["ensembles"]
    return next((item for item in rows if item["name"] == name), None)


def test_status_lists_an_ensemble_and_the_step_that_is_not_ready(appliance: Appliance) -> None:
    assert row(appliance, "six") == {
        "name": "six",
        "steps": ["doubled", "tripled"],
        "ready": True,
        "not_ready": None,
    }
    shown = ctl(appliance, "status")
    assert shown.returncode == 0, shown.stderr
    assert "ensemble six  ready  (steps: doubled -> tripled)" in shown.stdout
    unloaded = ctl(appliance, "unload", "tripled")
    assert unloaded.returncode == 0, unloaded.stderr
    try:
        assert eventually(lambda: settled(appliance), 30.0)
        waiting = row(appliance, "six")
        assert waiting is not None
        assert not waiting["ready"]
        assert waiting["not_ready"] == "step 1 (model tripled) is not loaded"
        assert "ensemble six  not ready: step 1 (model tripled) is not loaded" in (
            ctl(appliance, "status").stdout
        )
    finally:
        loaded = ctl(appliance, "load", "tripled")
        assert loaded.returncode == 0, loaded.stderr
    assert eventually(lambda: bool((r := row(appliance, "six")) and r["ready"]), 60.0)


def test_unload_and_load_take_an_ensemble(appliance: Appliance) -> None:
    client = appliance.client()
    assert six(client) == [6.0] * 4
    unloaded = ctl(appliance, "unload", "six")
    assert (unloaded.returncode, unloaded.stdout.strip()) == (0, "unloaded"), unloaded.stderr
    assert row(appliance, "six") is None
    assert "six" in appliance.ctl("status")["unloaded"]
    assert eventually(lambda: "six" not in client.models(), 10.0)
    # Its step models serve on.
    assert client.model_ready("doubled")
    assert client.model_ready("tripled")
    again = ctl(appliance, "unload", "six")
    assert again.returncode == 1
    assert again.stderr.strip() == "appliance ctl: failed to unload: model 'six' is not loaded"
    loaded = ctl(appliance, "load", "six")
    assert (loaded.returncode, loaded.stdout.strip()) == (0, "loading"), loaded.stderr
    assert eventually(lambda: "six" in client.models(), 10.0)
    assert six(client) == [6.0] * 4
    # Through the client API (KServe's repository load), which waits for it to serve.
    client.unload_model("six")
    client.load_model("six", timeout_s=60.0)
    assert six(client) == [6.0] * 4


def test_an_ensemble_has_no_keys_to_override(appliance: Appliance) -> None:
    client = appliance.client()
    with pytest.raises(ControlError) as raised:
        client.load_model("six", timeout_s=30.0, overrides={"max_batch_size": 4})
    message = str(raised.value)
    assert message == (
        "failed to load: 'six' is an ensemble: it has no [[models]] keys to override "
        "(max_batch_size); its steps' models have theirs"
    )
    assert row(appliance, "six") is not None


def test_reload_adds_an_ensemble_from_the_config_file(appliance: Appliance) -> None:
    path = appliance.run_dir / "config.toml"
    config = tomllib.loads(path.read_text())
    config["models"] = [*MODELS, chain("twelve", "doubled", "doubled", "tripled")]
    path.write_text(tomli_w.dumps(config))
    try:
        reloaded = ctl(appliance, "reload")
        assert reloaded.returncode == 0, reloaded.stderr
        assert "ensembles added: twelve" in reloaded.stdout
        client = appliance.client()
        assert eventually(lambda: "twelve" in client.models(), 10.0)
        with client.infer("twelve", {"x": np.ones((2, 4), np.float32)}) as result:
            assert result.array("y").tolist() == [[12.0] * 4] * 2
        assert row(appliance, "twelve") is not None
    finally:
        config["models"] = MODELS
        path.write_text(tomli_w.dumps(config))
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and not settled(appliance):
            time.sleep(0.1)
        assert ctl(appliance, "reload").returncode == 0
    assert eventually(lambda: row(appliance, "twelve") is None, 10.0)


def test_kserve_repository_unloads_and_loads_an_ensemble_that_answers_at_once(
    appliance: Appliance,
) -> None:
    import tritonclient.http as httpclient

    triton = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    x = httpclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        for _ in range(5):
            triton.unload_model("six")
            index = {entry["name"]: entry for entry in triton.get_model_repository_index()}
            assert index["six"]["state"] == "UNAVAILABLE", index["six"]
            triton.load_model("six")  # answers once it serves, in this very process too
            assert triton.infer("six", [x]).as_numpy("y").tolist() == [[6.0] * 4]
            index = {entry["name"]: entry for entry in triton.get_model_repository_index()}
            # As Triton lists a ready model: no reason.
            assert index["six"] == {"name": "six", "version": "1", "state": "READY"}
    finally:
        triton.close()
