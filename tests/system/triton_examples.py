"""Triton's own Python example clients, run unmodified from its client repository.

The repository is a mirror this machine may or may not hold; tests that run
the examples skip without it (the reason is in the skip line).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.harness import ROOT

REPO = Path("/work/.mirror/triton-inference-server+client/repo")
FOLDER = "src/python/examples"

needs_examples = pytest.mark.skipif(
    not REPO.exists(), reason=f"Triton's client repository is not at {REPO}"
)


def run(example: str, url: str, where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``example`` as Triton ships it against ``url``; return how it ended."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"HEAD:{FOLDER}/{example}"],
        check=True,
        capture_output=True,
    ).stdout
    script = where / example
    script.write_bytes(source)
    return subprocess.run(
        [sys.executable, str(script), "-u", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
