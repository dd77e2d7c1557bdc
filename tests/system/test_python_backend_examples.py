"""Triton's own Python-backend examples: their model.py and config.pbtxt, and their client.py.

The examples come from Triton's python_backend repository, a mirror this
machine may or may not hold (the tests skip without it, saying so). Each
model directory is laid out as the example's README says; each client.py
runs as shipped but for its server address (``localhost:8000``, ``:8001`` and
``:8002``, replaced by the appliance's ports, which tests choose at random).
The appliance serves them from tritonserver's command line
(``appliance serve --model-repository``), as their READMEs start tritonserver.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.harness import Appliance, free_ports, new_run_dir, start

REPO = Path("/work/.mirror/triton-inference-server+python_backend/repo")
pytestmark = pytest.mark.skipif(
    not REPO.exists(), reason=f"Triton's python_backend repository is not at {REPO}"
)

# model directory -> (model.py, config.pbtxt or None: auto-completed), from examples/.
MODELS = {
    "add_sub": ("add_sub/model.py", "add_sub/config.pbtxt"),
    "pytorch": ("pytorch/model.py", "pytorch/config.pbtxt"),
    "nobatch_auto_complete": ("auto_complete/nobatch_model.py", None),
    "batch_auto_complete": ("auto_complete/batch_model.py", None),
    "repeat_int32": ("decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
    "square_int32": ("decoupled/square_model.py", "decoupled/square_config.pbtxt"),
    "bls_sync": ("bls/sync_model.py", "bls/sync_config.pbtxt"),
    "bls_async": ("bls/async_model.py", "bls/async_config.pbtxt"),
    "bls_decoupled_sync": ("bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt"),
    "bls_decoupled_async": ("bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt"),
    "custom_metrics": ("custom_metrics/model.py", "custom_metrics/config.pbtxt"),
}
CLIENTS = [
    "add_sub/client.py",
    "pytorch/client.py",
    "auto_complete/client.py",
    "decoupled/repeat_client.py",
    "decoupled/square_client.py",
    "bls/sync_client.py",
    "bls/async_client.py",
    "bls_decoupled/sync_client.py",
    "bls_decoupled/async_client.py",
    "custom_metrics/client.py",
]


def shipped(path: str) -> bytes:
    done = subprocess.run(
        ["git", "-C", str(REPO), "show", f"HEAD:examples/{path}"], check=True, capture_output=True
    )
    return done.stdout


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    root = tmp_path_factory.mktemp("examples")
    for name, (model, config) in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_bytes(shipped(model))
        if config is not None:
            (root / name / "config.pbtxt").write_bytes(shipped(config))
    # Served as a Triton user starts tritonserver: its command line, no config.
    runtime = new_run_dir()
    http, grpc, metrics = free_ports(3)
    flags = (
        f"--model-repository={root}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
    )
    where = {"server": {"run_dir": str(runtime / "appliance")}}
    started = start(where, env={"XDG_RUNTIME_DIR": str(runtime)}, serve_args=flags)
    try:
        yield started
    finally:
        started.stop()
        started.assert_clean()
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.mark.parametrize("client", CLIENTS)
def test_the_example_client_passes_against_the_appliance(
    examples: Appliance, client: str, tmp_path: Path
) -> None:
    source = shipped(client)
    for port, kind in ((8000, "http"), (8001, "grpc"), (8002, "metrics")):
        source = source.replace(
            f"localhost:{port}".encode(), f"127.0.0.1:{examples.ports[kind]}".encode()
        )
    script = tmp_path / "client.py"
    script.write_bytes(source)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout, done.stdout
