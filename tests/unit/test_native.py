"""Which request path a process runs: compiled only while every compiled module is current."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance import native

PROBE = (
    "import appliance, appliance.worker.server as s, appliance.core.descriptor as d;"
    "print(appliance.native.state()); print(s.__file__); print(d.__file__)"
)


GUARDED = "import appliance.core.client_memory as c; print(c.GUARDED_COPY is not None)"


def probe(root: Path, code: str = PROBE, **env: str) -> list[str]:
    """What a fresh process that imports the package from ``root`` runs."""
    # The suite may run with the request path pure on purpose; the probes choose.
    without_pure = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**without_pure, "PYTHONPATH": str(root), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_pure_when_asked() -> None:
    state, server, descriptor = probe(native.ROOT, **{native.PURE_ENV: "1"})
    assert state == "pure Python (APPLIANCE_PURE is set)"
    assert server.endswith("server.py")
    assert descriptor.endswith("descriptor.py")


compiled = pytest.mark.skipif(
    native.MANIFEST.exists() is False, reason="the request path is not compiled here"
)


@compiled
def test_compiled_when_built() -> None:
    state, server, descriptor = probe(native.ROOT)
    assert state == "compiled (mypyc)"
    assert server.endswith(".so")
    assert descriptor.endswith(".so")


@compiled
def test_a_changed_source_runs_every_module_from_source(tmp_path: Path) -> None:
    # A copy of the package, its build included (copytree keeps modification times).
    shutil.copytree(
        native.PACKAGE,
        tmp_path / "appliance",
        ignore=shutil.ignore_patterns("__pycache__", "demos"),
    )
    assert probe(tmp_path)[0] == "compiled (mypyc)"
    edited = tmp_path / "appliance" / "worker" / "plain.py"
    edited.write_text(edited.read_text() + "\n")
    state, server, descriptor = probe(tmp_path)
    assert state.startswith("pure Python (sources changed since the build")
    # Not only the edited module: compiled modules call each other in C.
    assert server.endswith("server.py")
    assert descriptor.endswith("descriptor.py")


@compiled
def test_the_guarded_copy_runs_only_with_the_compiled_request_path(tmp_path: Path) -> None:
    """Shared memory's guarded copy (appliance/core/_guarded.c) is built with the request
    path and stands or falls with it: pure, client segments are copied with pread/pwrite."""
    assert probe(native.ROOT, GUARDED) == ["True"]
    assert probe(native.ROOT, GUARDED, **{native.PURE_ENV: "1"}) == ["False"]
    shutil.copytree(
        native.PACKAGE,
        tmp_path / "appliance",
        ignore=shutil.ignore_patterns("__pycache__", "demos"),
    )
    edited = tmp_path / "appliance" / "core" / "_guarded.c"
    edited.write_text(edited.read_text() + "\n")
    assert probe(tmp_path)[0].startswith("pure Python (sources changed since the build")
    assert probe(tmp_path, GUARDED) == ["False"]
