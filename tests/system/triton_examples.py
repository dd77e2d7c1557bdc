"""Triton's own Python example clients, run unmodified from its client repository.

The repository is a mirror this machine may or may not hold; tests that run
the examples skip without it (the reason is in the skip line).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.harness import ROOT

REPO = Path("/work/.mirror/triton-inference-server+client/repo")
FOLDER = "src/python/examples"
# A folder holding copies of the examples stands in for the repository where
# it is absent (on a host the mirror cannot reach: tools/bench_host).
COPIES = Path(os.environ.get("TRITON_EXAMPLES_DIR", "/nonexistent"))

needs_examples = pytest.mark.skipif(
    not REPO.exists() and not COPIES.is_dir(),
    reason=f"Triton's client repository is not at {REPO} (nor TRITON_EXAMPLES_DIR set)",
)


def run(example: str, url: str, where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``example`` as Triton ships it against ``url``; return how it ended."""
    if REPO.exists():
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"HEAD:{FOLDER}/{example}"],
            check=True,
            capture_output=True,
        ).stdout
    else:
        source = (COPIES / example).read_bytes()
    script = where / example
    script.write_bytes(source)
    return subprocess.run(
        [sys.executable, str(script), "-u", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
