"""Real peer servers for the differential tests: installed on first use, skipped where not.

Triton comes from the nvidia-pytriton wheel into bench/.peers/triton
(bench/triton_peer.py), the way the benchmarks install their peers; it is
never a dependency of the appliance. A test that needs it is skipped, with
the reason, only where it cannot be installed or started here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bench.servers import PeerServer, PeerUnavailable
from bench.triton_peer import tritonserver


@contextlib.contextmanager
def triton_serving(repository: Path, options: Sequence[str] = ()) -> Iterator[PeerServer]:
    """tritonserver for a ``with`` block; skips the test where it cannot run here.

    Afterwards its process tree is gone (bench.servers stops it by PID) and so
    is any shared memory its Python stubs left behind (bench/triton_peer.py).
    """
    try:
        with tritonserver(repository, options) as server:
            yield server
    except PeerUnavailable as ex:
        pytest.skip(f"real Triton is not available here: {ex}")
