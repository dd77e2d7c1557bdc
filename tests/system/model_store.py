"""``appliance serve --model-store``: the appliance started as a TorchServe user starts it.

Every port is a free loopback one (TorchServe's five: inference, management,
metrics, gRPC inference and gRPC management), token authorization is off
unless asked for, and the run directory is a fresh one under a private
XDG_RUNTIME_DIR, removed afterwards with every process (checked clean).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.system.harness import ROOT, Appliance, free_ports, new_run_dir, start


@contextlib.contextmanager
def serving_model_store(
    store: Path,
    models: Sequence[str] = ("all",),
    *,
    token_auth: bool = False,
    flags: Sequence[str] = (),
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Iterator[Appliance]:
    """The appliance serving ``store``'s ``models`` for a ``with`` block; its
    ``ports`` name http, grpc, metrics, management and grpc_management; ``flags``
    are more of torchserve's."""
    http, grpc, metrics, management, grpc_management = free_ports(5)
    line = [
        "--model-store",
        str(store),
        "--models",
        *models,
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        f"--management-port={management}",
        f"--grpc-management-port={grpc_management}",
        *flags,
    ]
    if not token_auth:
        line.append("--disable-token-auth")
    runtime = new_run_dir()
    # With serve's flags the run directory is the default one, under XDG_RUNTIME_DIR.
    appliance = start(
        {"server": {"run_dir": str(runtime / "appliance")}},
        serve_args=tuple(line),
        env={"XDG_RUNTIME_DIR": str(runtime), **(env or {})},
        cwd=cwd,
    )
    try:
        yield appliance
    finally:
        appliance.stop()
        appliance.assert_clean()
        shutil.rmtree(runtime, ignore_errors=True)
