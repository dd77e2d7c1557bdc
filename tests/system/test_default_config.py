"""What a new user meets with `make run`: the default config's models, every runtime.

One appliance serves appliance/default.toml's models, repositories and
GraphPipe root model, on ports 0.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from graphpipe import remote

from tests.system.harness import ROOT, Appliance, make_config, new_run_dir, serving

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

DEFAULTS = tomllib.loads((ROOT / "appliance" / "default.toml").read_text())


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    run_dir = new_run_dir()
    config = make_config(
        run_dir,
        DEFAULTS["models"],
        server={"default_model": DEFAULTS["server"]["default_model"]},
        http={"graphpipe_model": DEFAULTS["http"]["graphpipe_model"]},
    )
    # Relative repository paths start at default.toml's directory.
    config["repositories"] = [
        {**repo, "path": str(ROOT / "appliance" / repo["path"])}
        for repo in DEFAULTS["repositories"]
    ]
    with serving(config) as started:
        yield started


def test_the_repository_index_lists_onnx_and_torchscript_models_ready(
    appliance: Appliance,
) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        platforms = {
            name: client.get_model_metadata(name)["platform"]
            for name in ("digits_onnx", "digits_torch")
        }
    finally:
        client.close()
    for name in ("digits_onnx", "digits_torch", "digits", "echo"):
        assert index[name]["state"] == "READY", index[name]
    assert platforms == {"digits_onnx": "onnxruntime_onnx", "digits_torch": "pytorch_libtorch"}


def test_graphpipe_root_serves_a_model_with_declared_inputs_and_outputs(
    appliance: Appliance,
) -> None:
    root = f"http://127.0.0.1:{appliance.ports['http']}/"
    metadata: Any = remote.metadata(root)
    assert metadata.Name() == b"digits"
    assert remote.get_input_names(root) == ["pixels"]
    assert remote.get_output_names(root) == ["probabilities"]
    probabilities = remote.execute(root, np.zeros((3, 64), np.float32))
    assert probabilities.shape == (3, 10)
    # The status page is still there for a browser.
    page = requests.get(root, headers={"Accept": "text/html"}, timeout=10)
    assert page.status_code == 200
