"""Peer servers for bench_peers.py, each in a virtual environment of its own.

Every peer is installed by pip into ``bench/.peers/<name>/`` (git-ignored) on
first use and reused while its requirement list is unchanged; none of it is
ever a dependency of the appliance. A peer that cannot be installed or
started raises :class:`PeerUnavailable` with the reason, and the benchmark
goes on without it.

Peers: Seldon MLServer 1.7.1 (V2 REST and gRPC, ``parallel_workers`` 1 and
0), UM-Bridge's own Python server, a bare falcon+gunicorn app (the floor
of a Python HTTP frontend) under each HTTP stack gunicorn can drive
(``FLOOR_KINDS``: uvicorn's worker class, the appliance's; gunicorn's ASGI
worker on asyncio, the appliance's before, and on uvloop; gthread and sync),
bare grpcio (the floor of a Python gRPC frontend), aio and sync, and the
ladder of one HTTP request on the appliance's own worker
(peers/ladder_app.py: floor, plus the middleware, plus the codecs).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from bench.loadgen import ProcessTree

ROOT = Path(__file__).resolve().parents[1]
PEERS_DIR = ROOT / "bench" / ".peers"
PEER_CODE = ROOT / "bench" / "peers"
DIGITS_WEIGHTS = ROOT / "appliance" / "demos" / "digits_weights.npz"
INSTALL_TIMEOUT_S = 900.0
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
# MLServer 1.7.1's parallel workers crash-loop under the uvloop it resolves
# (0.22+): pin 0.21.0 (PEERS.md §5).
MLSERVER = ["mlserver==1.7.1", "uvloop==0.21.0"]
UMBRIDGE = ["umbridge==1.2.10", "numpy"]
# MLServer's own runtimes, for model folders served by both MLServer and the
# appliance (tests/peers, bench/bench_mlserver_runtime.py); the libraries the
# artefacts were written with are pinned to this Python's (runtime_pins).
MLSERVER_RUNTIMES = [
    "mlserver-sklearn==1.7.1",
    "mlserver-lightgbm==1.7.1",
    "mlserver-xgboost==1.7.1",
]
RUNTIME_LIBRARIES = ("scikit-learn", "xgboost", "lightgbm", "joblib", "numpy", "pandas")
# Names a site-packages directory every peer environment sees as well.
BASE_SITE_ENV = "BENCH_BASE_SITE"
_WRITE_BASE_PTH = (
    "import pathlib, sys, sysconfig; "
    "pathlib.Path(sysconfig.get_paths()['purelib'], '_base.pth').write_text(sys.argv[1] + '\\n')"
)
# Any recent matplotlib draws the plot; a host that has one (the bench host) uses it.
PLOT = ["matplotlib>=3.8"]


class PeerUnavailable(Exception):
    """A peer could not be installed or started here; the message says why."""


def runtime_pins() -> list[str]:
    """This Python's scikit-learn, XGBoost, LightGBM (...): a model pickled here loads there."""
    pins = []
    for name in RUNTIME_LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            pins.append(f"{name}=={importlib.metadata.version(name)}")
    return pins


def floor_requirements() -> list[str]:
    """The floor runs the appliance's own falcon, gunicorn, uvicorn stack and orjson."""
    names = ("falcon", "gunicorn", "uvicorn", "uvicorn-worker", "uvloop", "httptools", "orjson")
    pins = []
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            pins.append(f"{name}=={importlib.metadata.version(name)}")
    return pins


# gunicorn's C HTTP parser, which its ASGI worker picks when installed (the
# appliance's stack before uvicorn's worker had it). Source only: where it
# does not build, that floor parses in Python (its details say which).
FLOOR_OPTIONAL = ["gunicorn-h1c>=0.6.10"]


def ensure_venv(name: str, requirements: list[str], optional: list[str] | None = None) -> Path:
    """Return ``bench/.peers/<name>/bin``, creating the environment if needed.

    ``optional`` packages are installed after the rest where they install.

    Raises:
        PeerUnavailable: venv or pip failed (the log's tail is in the message).
    """
    home = PEERS_DIR / name
    marker = home / ".requirements"
    wanted = "\n".join(requirements + [f"optional: {o}" for o in optional or []])
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    with (PEERS_DIR / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another benchmark may be installing it
        if marker.exists() and marker.read_text() == wanted and (home / "bin/python").exists():
            return home / "bin"
        shutil.rmtree(home, ignore_errors=True)
        print(f"installing {name} into {home.relative_to(ROOT)}: {wanted}", file=sys.stderr)
        base = getattr(sys, "_base_executable", sys.executable)
        log = PEERS_DIR / f"{name}.log"
        steps = [
            [base, "-m", "venv", str(home)],
            [str(home / "bin/python"), "-m", "pip", "install", "--quiet", *requirements],
        ]
        if os.environ.get(BASE_SITE_ENV):
            # A host whose packages live in another environment (the bench
            # host's /opt/torch/.venv, see tools/bench_host/run.sh): the
            # peer sees them, and pip counts them as installed.
            python = str(home / "bin/python")
            steps.insert(1, [python, "-c", _WRITE_BASE_PTH, os.environ[BASE_SITE_ENV]])
        with log.open("w") as out:
            for step in steps:
                try:
                    code = subprocess.run(
                        step, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S
                    ).returncode
                except subprocess.TimeoutExpired:
                    code = -1
                if code:
                    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                    raise PeerUnavailable(f"{name}: {' '.join(step[:4])} failed: {tail}")
            for extra in optional or []:
                pip = [str(home / "bin/python"), "-m", "pip", "install", "--quiet", extra]
                with contextlib.suppress(subprocess.TimeoutExpired):
                    subprocess.run(pip, stdout=out, stderr=subprocess.STDOUT, timeout=300)
        marker.write_text(wanted)
    return home / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PeerServer:
    """A running peer: its URLs and its process tree."""

    name: str
    process: subprocess.Popen[bytes]
    urls: dict[str, str]
    log: Path
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def tree(self) -> ProcessTree:
        return ProcessTree(self.process.pid)

    def stop(self) -> None:
        """SIGTERM the root, wait, then SIGKILL whatever of its tree is left (by PID)."""
        try:
            family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            family = []
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        _gone, alive = psutil.wait_procs(family, timeout=5)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()


@contextlib.contextmanager
def started(
    name: str,
    argv: list[str],
    urls: dict[str, str],
    ready: Callable[[], bool],
    cwd: Path,
    env: dict[str, str] | None = None,
) -> Iterator[PeerServer]:
    """Start a peer, wait until ``ready()``, stop it when the block ends.

    Raises:
        PeerUnavailable: it exited or was not ready within START_TIMEOUT_S.
    """
    log = PEERS_DIR / f"{name}.server.log"
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    if log.exists():
        # The last start's console is kept once: where a peer died in a test and
        # is started again for the next, what it said before dying is there.
        log.replace(log.with_name(f"{name}.server.previous.log"))
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    server = PeerServer(name, process, urls, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _poll(ready):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                raise PeerUnavailable(f"{name} did not start: {tail}")
            time.sleep(0.2)
        yield server
    finally:
        server.stop()


def _poll(ready: Callable[[], bool]) -> bool:
    try:
        return ready()
    except (requests.RequestException, OSError):
        return False


def http_ok(*urls: str) -> Callable[[], bool]:
    return lambda: all(requests.get(url, timeout=2).status_code == 200 for url in urls)


@contextlib.contextmanager
def mlserver(parallel_workers: int) -> Iterator[PeerServer]:
    """MLServer serving identity and digits (bench/peers/mlserver_models.py)."""
    bin_dir = ensure_venv("mlserver", MLSERVER)
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    with tempfile.TemporaryDirectory(prefix="bench-mlserver-") as repo:
        settings = {
            # debug false: no per-request access log, as the appliance runs here.
            "debug": False,
            "parallel_workers": parallel_workers,
            "host": "127.0.0.1",
            "http_port": ports["http"],
            "grpc_port": ports["grpc"],
            "metrics_port": ports["metrics"],
            "grpc_max_message_length": 1 << 30,
        }
        models = {
            "identity": {"implementation": "mlserver_models.Identity"},
            "digits": {
                "implementation": "mlserver_models.Digits",
                "parameters": {"uri": str(DIGITS_WEIGHTS)},
            },
        }
        Path(repo, "settings.json").write_text(json.dumps(settings))
        for model, body in models.items():
            Path(repo, model).mkdir()
            Path(repo, model, "model-settings.json").write_text(json.dumps({"name": model, **body}))
        base = f"http://127.0.0.1:{ports['http']}"
        ready = http_ok(*(f"{base}/v2/models/{m}/ready" for m in models))
        urls = {"rest": f"127.0.0.1:{ports['http']}", "grpc": f"127.0.0.1:{ports['grpc']}"}
        argv = [str(bin_dir / "mlserver"), "start", repo]
        env = {"PYTHONPATH": str(PEER_CODE)}
        name = f"mlserver-pw{parallel_workers}"
        with started(name, argv, urls, ready, Path(repo), env) as server:
            server.details = {"version": "1.7.1", "settings": settings}
            yield server


@contextlib.contextmanager
def mlserver_folder(folder: Path, parallel_workers: int = 1) -> Iterator[PeerServer]:
    """``mlserver start FOLDER`` with MLServer's runtimes, ready once every model has loaded
    or failed to (the folder is served as it is: ports come from the environment)."""
    bin_dir = ensure_venv("mlserver-runtimes", MLSERVER + MLSERVER_RUNTIMES + runtime_pins())
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    env = {
        "MLSERVER_HOST": "127.0.0.1",
        "MLSERVER_HTTP_PORT": str(ports["http"]),
        "MLSERVER_GRPC_PORT": str(ports["grpc"]),
        "MLSERVER_METRICS_PORT": str(ports["metrics"]),
        "MLSERVER_PARALLEL_WORKERS": str(parallel_workers),
        "MLSERVER_DEBUG": "false",
    }
    base = f"http://127.0.0.1:{ports['http']}"
    wanted = len(list(folder.rglob("model-settings.json")))

    def settled() -> bool:
        index = requests.post(f"{base}/v2/repository/index", json={}, timeout=2).json()
        return len(index) >= wanted and all(e.get("state") != "LOADING" for e in index)

    urls = {"http": f"127.0.0.1:{ports['http']}", "grpc": f"127.0.0.1:{ports['grpc']}"}
    argv = [str(bin_dir / "mlserver"), "start", str(folder)]
    name = f"mlserver-folder-pw{parallel_workers}"
    with started(name, argv, urls, settled, folder, env) as server:
        server.details = {"version": "1.7.1", "parallel_workers": parallel_workers}
        yield server


@contextlib.contextmanager
def umbridge_server(sizes: dict[str, int]) -> Iterator[PeerServer]:
    """UM-Bridge's own server with fixed-size identities and digits."""
    bin_dir = ensure_venv("umbridge", UMBRIDGE)
    port = free_port()
    argv = [
        str(bin_dir / "python"),
        str(PEER_CODE / "umbridge_server.py"),
        str(port),
        str(DIGITS_WEIGHTS),
        *(f"{label}={size}" for label, size in sizes.items()),
    ]
    url = f"127.0.0.1:{port}"
    ready = http_ok(f"http://{url}/Info")
    with started("umbridge", argv, {"umbridge": url}, ready, PEER_CODE) as server:
        server.details = {"version": "1.2.10", "server": "umbridge.serve_models (aiohttp)"}
        yield server


# kind: (gunicorn worker class, its options, app). uvicorn is the appliance's
# HTTP stack (uvicorn's worker class: uvloop and httptools); asgi the one it
# had before (gunicorn's ASGI worker on asyncio, with gunicorn's C parser).
FLOOR_KINDS = {
    "uvicorn": ("uvicorn_worker.UvicornWorker", [], "floor_asgi_app:app"),
    "asgi": ("gunicorn.workers.gasgi.ASGIWorker", ["--asgi-loop=asyncio"], "floor_asgi_app:app"),
    "asgi-uvloop": (
        "gunicorn.workers.gasgi.ASGIWorker",
        ["--asgi-loop=uvloop"],
        "floor_asgi_app:app",
    ),
    "gthread": ("gthread", [], "floor_app:app"),
    "sync": ("sync", [], "floor_app:app"),
}


@contextlib.contextmanager
def floor(kind: str, workers: int, threads: int) -> Iterator[PeerServer]:
    """The falcon floor under gunicorn with a worker class of FLOOR_KINDS."""
    requirements = floor_requirements()
    bin_dir = ensure_venv("floor", requirements, FLOOR_OPTIONAL)
    port = free_port()
    worker_class, options, app = FLOOR_KINDS[kind]
    threaded = kind == "gthread"
    argv = [
        str(bin_dir / "gunicorn"),
        f"--bind=127.0.0.1:{port}",
        f"--workers={workers}",
        f"--worker-class={worker_class}",
        *options,
        *([f"--threads={threads}"] if threaded else []),
        "--keep-alive=30",  # as the appliance's HTTP frontend
        "--backlog=2048",
        app,
    ]
    url = f"127.0.0.1:{port}"
    ready = http_ok(f"http://{url}/v2/health/ready")
    c_parser = _has_module(bin_dir, "gunicorn_h1c")
    with started(f"floor-{kind}", argv, {"rest": url}, ready, PEER_CODE) as server:
        server.details = {
            "requirements": requirements,
            "worker_class": worker_class,
            "options": options,
            "gunicorn_c_parser": c_parser,
            "workers": workers,
            "threads": threads if threaded else 1,
        }
        yield server


def _has_module(bin_dir: Path, module: str) -> bool:
    probe = [str(bin_dir / "python"), "-c", f"import {module}"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def ladder(rung: str, run_dir: str, workers: int) -> Iterator[PeerServer]:
    """A rung of peers/ladder_app.py on the appliance at ``run_dir`` (its environment)."""
    port = free_port()
    argv = [sys.executable, str(PEER_CODE / "ladder_app.py"), str(port), rung, run_dir]
    argv.append(str(workers))
    url = f"127.0.0.1:{port}"
    ready = http_ok(f"http://{url}/v2/health/ready")
    env = {"PYTHONPATH": str(ROOT)}
    with started(f"ladder-{rung}", argv, {"http": url}, ready, PEER_CODE, env) as server:
        server.details = {"rung": rung, "workers": workers, "worker_class": "the appliance's"}
        yield server


@contextlib.contextmanager
def grpc_floor(kind: str, workers: int, threads: int) -> Iterator[PeerServer]:
    """grpcio answering ModelInfer (peers/floor_grpc_app.py): ``kind`` is aio or sync (in
    place), aio-codec (in place, through the appliance's codec), or aio-hop (after a
    ZeroMQ round trip to an echoing process).

    It runs in the appliance's own environment: its grpcio, protobuf and stubs.
    """
    port = free_port()
    argv = [sys.executable, str(PEER_CODE / "floor_grpc_app.py"), str(port), kind]
    argv += [str(workers), str(threads)]
    url = f"127.0.0.1:{port}"
    with started(
        f"floor-grpc-{kind}",
        argv,
        {"grpc": url},
        grpc_ready(url),
        PEER_CODE,
        {"PYTHONPATH": str(ROOT)},
    ) as server:
        server.details = {
            "grpcio": importlib.metadata.version("grpcio"),
            "server": {
                "aio": "grpc.aio",
                "aio-hop": "grpc.aio, each call's input to hop_echo.py and back over ZeroMQ",
                "aio-codec": "grpc.aio, answered through the appliance's pbcodec",
                "sync": "grpc.server with a thread pool",
            }[kind],
            "workers": workers,
            "threads": threads if kind == "sync" else 1,
        }
        yield server


def grpc_ready(url: str) -> Callable[[], bool]:
    """ServerReady over raw bytes: the bench's process also imports tritonclient's stubs,
    which register the same protobuf names as the appliance's."""

    def ready() -> bool:
        import grpc

        with grpc.insecure_channel(url) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ServerReady")
            try:
                return bool(call(b"", timeout=2) == b"\x08\x01")  # ready: true
            except grpc.RpcError:
                return False

    return ready


def plot_python() -> Path:
    """The interpreter of the bench-only environment that has matplotlib."""
    return ensure_venv("plot", PLOT) / "python"
