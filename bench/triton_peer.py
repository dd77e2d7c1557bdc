"""Real Triton (tritonserver 2.51 from the ``nvidia-pytriton`` wheel) as a peer.

The wheel ships a whole ``tritonserver`` with its Python backend, CPU only.
It goes into ``bench/.peers/triton/`` like every peer (never a dependency of
the appliance) and serves a Triton model repository of Python-backend
models. Three things make it run here (shared/PEERS.md §8):

- the Python stub is not where the backend looks for it: the one for the
  environment's Python is copied from ``python_backend_stubs/3.X/`` into
  ``backends/python/``;
- the stub imports its packages from the Python first on PATH, not from
  PYTHONPATH, so that environment's ``bin/`` leads PATH; and it needs
  numpy < 2 there, which the wheel pins;
- no GPU: ``--allow-gpu-metrics=false``.

The benchmarks and the oracle tests (tests/peers/) both start it from here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from bench.servers import (
    DIGITS_WEIGHTS,
    PEER_CODE,
    PeerServer,
    PeerUnavailable,
    ensure_venv,
    free_port,
    http_ok,
    started,
)

# The benchmarks' models as Triton Python models (the appliance serves the same files).
BENCH_MODELS = PEER_CODE / "python_backend"
TRITON = ["nvidia-pytriton==0.7.0"]
VERSION = "2.51.0"
STUB = "triton_python_backend_stub"
SHM = Path("/dev/shm")
# Triton's Python backend names its stubs' shared memory with this prefix.
SHM_PREFIX = "triton_python_backend_shm_region"


def tritonserver_home() -> tuple[Path, Path]:
    """Install the peer if needed; return (tritonserver's folder, the venv's bin/).

    Raises:
        PeerUnavailable: the wheel did not install, or it lacks the server or a
            Python stub for the environment's Python.
    """
    bin_dir = ensure_venv("triton", TRITON)
    homes = sorted(bin_dir.parent.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not homes:
        raise PeerUnavailable(f"triton: no pytriton/tritonserver under {bin_dir.parent}")
    home = homes[-1]
    python = home.parts[-4]  # lib/python3.X/site-packages/pytriton/tritonserver
    stub = home / "backends" / "python" / STUB
    if not stub.exists():
        shipped = home / "python_backend_stubs" / python.removeprefix("python") / STUB
        if not shipped.exists():
            raise PeerUnavailable(f"triton: the wheel has no Python stub for {python}")
        shutil.copy2(shipped, stub)
    return home, bin_dir


@contextlib.contextmanager
def tritonserver(repository: Path, options: Sequence[str] = ()) -> Iterator[PeerServer]:
    """tritonserver on loopback, serving ``repository``; stopped when the block ends.

    ``urls`` has ``http``, ``grpc`` and ``metrics`` as host:port. ``options``
    are more tritonserver flags (``--model-control-mode=explicit``, ...).

    Raises:
        PeerUnavailable: it could not be installed, or did not become live.
    """
    home, bin_dir = tritonserver_home()
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    argv = [
        str(home / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        f"--backend-directory={home / 'backends'}",
        f"--cache-directory={home / 'caches'}",
        "--allow-gpu-metrics=false",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        f"--http-port={ports['http']}",
        f"--grpc-port={ports['grpc']}",
        f"--metrics-port={ports['metrics']}",
        # Its default (30 s) outlasts the stop's wait: stubs would be killed mid-cleanup.
        "--exit-timeout-secs=5",
        *options,
    ]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    urls = {kind: f"127.0.0.1:{port}" for kind, port in ports.items()}
    live = http_ok(f"http://{urls['http']}/v2/health/live")
    before = set(os.listdir(SHM))
    pid = 0
    try:
        with started("triton", argv, urls, live, repository, env) as server:
            pid = server.process.pid
            server.details = {"version": VERSION, "options": list(options)}
            yield server
    finally:
        if pid:
            _stop_stubs_of(pid)
        # A stub killed before it cleaned up leaves its region behind; one that
        # a process still maps (another tritonserver's, made meanwhile) stays.
        left = {n for n in set(os.listdir(SHM)) - before if n.startswith(SHM_PREFIX)}
        for name in left - _mapped(left):
            with contextlib.suppress(FileNotFoundError):
                (SHM / name).unlink()


def _stop_stubs_of(pid: int) -> None:
    """Kill, by PID, the Python stubs tritonserver ``pid`` started that are still there.

    Its stop kills its process tree; a server that died first has left its stubs
    orphaned, outside any tree, each mapping its region. A stub names its server's
    PID on its command line (its sixth argument).
    """
    stubs = []
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"] or []
        if len(argv) > 5 and argv[0].endswith(STUB) and argv[5] == str(pid):
            stubs.append(process)
    for stub in stubs:
        with contextlib.suppress(psutil.Error):
            stub.kill()
    psutil.wait_procs(stubs, timeout=5)


def _mapped(names: set[str]) -> set[str]:
    """Those of ``names`` (in /dev/shm) that some process maps now."""
    found: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            text = maps.read_text()
            found |= {name for name in names if name in text}
    return found


@contextlib.contextmanager
def bench_repository(names: dict[str, str] | None = None) -> Iterator[Path]:
    """bench/peers/python_backend in a temporary directory, the digits weights beside
    digits_py's model.py; ``names`` renames models (``{"identity_py": "identity"}``)."""
    names = names or {}
    with tempfile.TemporaryDirectory(prefix="bench-pybackend-") as where:
        root = Path(where)
        for model in BENCH_MODELS.iterdir():
            served = names.get(model.name, model.name)
            shutil.copytree(model, root / served)
            config = root / served / "config.pbtxt"
            text = re.sub(r'^name: ".*"$', f'name: "{served}"', config.read_text(), flags=re.M)
            config.write_text(text)
        weights = root / names.get("digits_py", "digits_py") / "1" / "digits_weights.npz"
        shutil.copy(DIGITS_WEIGHTS, weights)
        yield root


@contextlib.contextmanager
def bench_models() -> Iterator[PeerServer]:
    """tritonserver serving the benchmarks' ``identity`` and ``digits`` as Python models."""
    with (
        bench_repository({"identity_py": "identity", "digits_py": "digits"}) as models,
        tritonserver(models) as server,
    ):
        yield server
