"""A short soak (bench/soak.py: a warm-up, 34 s measured): every protocol loaded, nothing grows.

``make soak`` runs the same driver for ten minutes. Its table (RSS and open
fds of every process, the tree's /dev/shm bytes; calls per protocol) is
printed (``pytest -s`` or ``-rP``) and kept as soak.json in the tmp dir.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.harness import ROOT

MINUTES = 0.75


@pytest.mark.long
def test_a_short_soak_grows_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [sys.executable, "bench/soak.py", "--minutes", str(MINUTES), "--out", str(out)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    print(run.stdout)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr[-4000:]}"
    assert out.exists()
