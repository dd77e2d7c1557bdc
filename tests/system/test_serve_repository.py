"""``appliance serve --model-repository DIR``: a Triton repository served from tritonserver's flags.

A Triton user's command line, with no config written: the flags become the
config (appliance/formats/command_line.py), in a file of the appliance's own that is
gone once it stops. tritonclient drives it on the ports the flags named.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.system.harness import ROOT, Appliance, free_ports, new_run_dir, start

MODELS = ROOT / "tests" / "data" / "python_models"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Appliance, Path]]:
    repository = tmp_path_factory.mktemp("repository")
    shutil.copytree(MODELS, repository, dirs_exist_ok=True)
    runtime, temp = new_run_dir(), tmp_path_factory.mktemp("tmp")
    http, grpc, metrics = free_ports(3)
    flags = (
        f"--model-repository={repository}",
        "--http-port",
        str(http),
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--load-model",
        "square_stream",
        "--exit-timeout-secs=5",
        "--backend-directory=/opt/tritonserver/backends",
        "--cache-config=local,size=65536",
    )
    # The run directory is the default one, under XDG_RUNTIME_DIR.
    where = {"server": {"run_dir": str(runtime / "appliance")}}
    env = {"XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(temp)}
    appliance = start(where, env=env, serve_args=flags)
    try:
        yield appliance, temp
    finally:
        appliance.stop()
        appliance.assert_clean()
        shutil.rmtree(runtime, ignore_errors=True)
    assert not list(temp.glob("appliance-serve-*")), "its config file outlived it"


def test_the_flags_name_the_ports_and_the_models_served_from_the_start(
    served: tuple[Appliance, Path],
) -> None:
    appliance, _ = served
    assert "mip" not in appliance.ports  # Triton has no MIP: nothing on its port 8002
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        a = np.ones((1, 4), dtype=np.float32)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            inputs.append(httpclient.InferInput(name, [1, 4], "FP32"))
            inputs[-1].set_data_from_numpy(a)
        assert np.array_equal(rest.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
        index = {entry["name"]: entry for entry in rest.get_model_repository_index()}
        assert index["add_sub"]["state"] == "READY"
        assert index["square_stream"]["state"] == "READY"
        # --model-control-mode=explicit: the others wait for a load.
        assert (index["misbehaving"]["state"], index["misbehaving"]["reason"]) == (
            "UNAVAILABLE",
            "unloaded",
        )
        assert not rest.is_model_ready("misbehaving")
        rest.load_model("misbehaving")
        assert rest.is_model_ready("misbehaving")
        assert rest.is_server_ready()
    finally:
        rest.close()


def test_the_metrics_port_answers_metrics_alone(served: tuple[Appliance, Path]) -> None:
    appliance, _ = served
    base = f"http://127.0.0.1:{appliance.ports['metrics']}"
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        assert b"# TYPE appliance_model_requests_total counter" in reply.read()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/v2/health/ready", timeout=10)
    refused.value.close()
    assert refused.value.code == 404
    # The HTTP port serves /metrics too.
    url = f"http://127.0.0.1:{appliance.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200


def test_its_config_file_is_its_own_and_goes_when_it_stops(
    served: tuple[Appliance, Path],
) -> None:
    _, temp = served
    [config] = list(temp.glob("appliance-serve-*.toml"))
    assert 'load_models = ["add_sub", "square_stream"]' in config.read_text()
    assert "response_cache_bytes = 65536" in config.read_text()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--metrics-port", "x"], "--metrics-port=x: expected a whole number"),
        (["--model-control-mode=poll"], "--model-control-mode=poll is not taken: reload with"),
        (["--load-model=x"], "--load-model needs --model-control-mode=explicit"),
        (
            ["--pinned-memory-pool-byte-size=0"],
            "--pinned-memory-pool-byte-size: not a tritonserver flag appliance serve takes",
        ),
        (["--http-port=port"], "--http-port=port: expected a whole number"),
        (["--strict-readiness=false"], "--strict-readiness=false is not taken"),
        (["--cache-config=redis,host=x"], "--cache-config=redis,host=x: the appliance's cache"),
        (["--cache-config=local,size=big"], "expected local,size=N (N bytes)"),
    ],
)
def test_a_tritonserver_flag_it_does_not_take_is_refused_by_name(
    flags: list[str], words: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", f"--model-repository={tmp_path}", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 2
    assert words in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("appliance-serve-*"))
