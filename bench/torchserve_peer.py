"""Real TorchServe 0.12.0 as a peer (its Java frontend and Python workers, CPU torch).

It goes into ``bench/.peers/torchserve/`` like every peer (never a
dependency of the appliance); Java 17 comes from the host (``/usr/bin/java``
or ``JAVA_HOME``). Each start gets a private temporary directory: TorchServe
keeps its pid file (``TMPDIR``), its unpacked archives and its workers'
unix sockets (``java.io.tmpdir``, from ``TEMP``) there, and its log files
(``logs/``, through ``LOG_LOCATION`` and ``METRICS_LOCATION``), beside the
``config.properties`` written for that start. Two peers never share a
socket, and nothing is left in ``/tmp``. The console goes to
``bench/.peers/torchserve-<id>.server.log``, removed after a block that
ended without an exception (kept for a look after a failure).

``torchserve --foreground`` is a Python launcher that waits on the Java
frontend; the frontend starts one Python worker per model worker. Stopping
goes by PID, never ``torchserve --stop``: SIGTERM to the frontend (its
shutdown hook stops the workers), then SIGKILL to whatever of the tree (or
any process naming the private directory) is left; the directory goes last.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import psutil
import requests

from bench.servers import (
    PEERS_DIR,
    STOP_TIMEOUT_S,
    PeerServer,
    PeerUnavailable,
    ensure_venv,
    free_port,
    started,
)

VERSION = "0.12.0"
# torch 2.13.0 is the CPU wheel in /opt/wheels (pip's find-links): the pin keeps
# pip from resolving a CUDA build from the index. No torchvision: its wheel from
# the index (0.28.0) is built against CUDA torch, and its C operators do not
# load beside the CPU one ("operator torchvision::nms does not exist"), so
# TorchServe's vision handlers (ImageClassifier, ...) cannot be imported here.
# numpy, which torchserve does not require, for its request envelopes
# (service_envelope: ts/torch_handler/request_envelope imports it).
TORCHSERVE = [
    f"torchserve=={VERSION}",
    f"torch-model-archiver=={VERSION}",
    "pyyaml",
    "torch==2.13.0",
    "numpy",
]
READY_TIMEOUT_S = 300.0
FRONTEND_CLASS = "org.pytorch.serve.ModelServer"
LOG_TAIL_LINES = 25


def torchserve_bin() -> Path:
    """Install the peer if needed; return the venv's ``bin/``.

    Raises:
        PeerUnavailable: pip failed (the log's tail is in the message).
    """
    return ensure_venv("torchserve", TORCHSERVE)


def java() -> str:
    """The java TorchServe's launcher will run (it reads JAVA_HOME, else PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home, "bin", "java")) if home else shutil.which("java")
    if not found or not Path(found).exists():
        raise PeerUnavailable("torchserve: no java (set JAVA_HOME or put java on PATH)")
    return found


def model_names(model_store: Path, models: str | Sequence[str]) -> list[str]:
    """The names TorchServe will register for ``--models`` ``models`` from ``model_store``.

    ``"all"`` is every ``.mar`` / ``.model`` / ``.tar.gz`` file and every folder
    in the store; ``name=archive`` names its model; a bare archive takes the
    ``modelName`` of its manifest (else the file's stem).
    """
    if isinstance(models, str):
        models = [models]
    if [m.lower() for m in models] == ["all"]:
        entries = [
            p.name
            for p in sorted(model_store.iterdir())
            if not p.name.startswith(".")
            and (p.is_dir() or p.name.endswith((".mar", ".model", ".tar.gz")))
        ]
        return [_manifest_name(model_store / e) for e in entries]
    names = []
    for spec in models:
        name, _, url = spec.rpartition("=")
        names.append(name or _manifest_name(model_store / url))
    return names


def _manifest_name(archive: Path) -> str:
    stem = archive.name.split(".")[0]
    try:
        if archive.is_dir():
            text = (archive / "MAR-INF" / "MANIFEST.json").read_text()
        else:
            with zipfile.ZipFile(archive) as z:
                text = z.read("MAR-INF/MANIFEST.json").decode()
        return str(json.loads(text)["model"]["modelName"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return stem


def render_properties(values: Mapping[str, str]) -> str:
    """config.properties text (Java properties: ``key=value`` lines, ``\\`` escaped)."""
    lines = [f"{key}={str(value).replace(chr(92), chr(92) * 2)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def torchserve(
    model_store: Path,
    models: str | Sequence[str] = "all",
    properties: Mapping[str, str] | None = None,
    *,
    ready_timeout_s: float = READY_TIMEOUT_S,
    token_auth: bool = False,
) -> Iterator[PeerServer]:
    """TorchServe on loopback serving ``models`` from ``model_store``; stopped by PID after.

    ``models`` is ``"all"`` or TorchServe's ``--models`` entries
    (``"echo.mar"``, ``"echo=echo.mar"``, a folder). ``properties`` go into
    config.properties over the defaults (``default_workers_per_model=1``, where
    TorchServe's own default is one worker per CPU; the five listeners on
    127.0.0.1 free ports). Ready once ``/ping``
    answers Healthy and every model has a READY worker. ``urls`` has
    ``inference``, ``management``, ``metrics`` (``http://host:port``) and
    ``grpc_inference``, ``grpc_management`` (``host:port``); ``details``
    has ``version``, ``models``, ``properties``, ``tmpdir`` and ``logs``
    (the log folder, which goes with the rest when the block ends).

    Raises:
        PeerUnavailable: it could not be installed, or was not ready in time
            (the message has the tail of its console log).
    """
    bin_dir = torchserve_bin()
    java_bin = java()
    model_store = Path(model_store).resolve()
    names = model_names(model_store, models)
    ports = {k: free_port() for k in ("inference", "management", "metrics", "gi", "gm")}
    urls = {
        "inference": f"http://127.0.0.1:{ports['inference']}",
        "management": f"http://127.0.0.1:{ports['management']}",
        "metrics": f"http://127.0.0.1:{ports['metrics']}",
        "grpc_inference": f"127.0.0.1:{ports['gi']}",
        "grpc_management": f"127.0.0.1:{ports['gm']}",
    }
    values = {
        "inference_address": urls["inference"],
        "management_address": urls["management"],
        "metrics_address": urls["metrics"],
        "grpc_inference_address": "127.0.0.1",
        "grpc_management_address": "127.0.0.1",
        "grpc_inference_port": str(ports["gi"]),
        "grpc_management_port": str(ports["gm"]),
        "default_workers_per_model": "1",
        **(properties or {}),
    }
    PEERS_DIR.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="torchserve-"))
    label = tmp.name  # torchserve-<id>: peers started at once keep their consoles apart
    seen: dict[int, psutil.Process] = {}
    failed = True
    try:
        logs = tmp / "logs"
        logs.mkdir()
        config = tmp / "config.properties"
        config.write_text(render_properties(values))
        argv = [
            str(bin_dir / "torchserve"),
            "--foreground",
            "--ncs",
            *([] if token_auth else ["--disable-token-auth"]),
            "--enable-model-api",
            f"--ts-config={config}",
            f"--model-store={model_store}",
            "--models",
            *([models] if isinstance(models, str) else models),
        ]
        env = {
            "TMPDIR": str(tmp),
            "TEMP": str(tmp),
            "LOG_LOCATION": str(logs),
            "METRICS_LOCATION": str(logs),
            "JAVA_HOME": str(Path(java_bin).resolve().parents[1]),
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        ping = f"{urls['inference']}/ping"

        def listening() -> bool:
            headers = _key(tmp, "inference")
            return requests.get(ping, headers=headers, timeout=2).status_code in (200, 500)

        with started(label, argv, urls, listening, tmp, env) as server:
            try:
                server.details = {
                    "version": VERSION,
                    "models": names,
                    "properties": values,
                    "tmpdir": str(tmp),
                    "logs": str(logs),
                    "processes": seen,
                }
                _track(server, tmp, seen)
                _wait_ready(server, names, ready_timeout_s, tmp, seen)
                yield server
                failed = False
            finally:
                _stop(server, tmp, seen)
    finally:
        _sweep(tmp, seen)
        shutil.rmtree(tmp, ignore_errors=True)
        if not failed:
            (PEERS_DIR / f"{label}.server.log").unlink(missing_ok=True)


def _track(server: PeerServer, tmp: Path, seen: dict[int, psutil.Process]) -> None:
    """Remember every process of the tree (and any naming ``tmp``) by PID and start time."""
    for process in [*_tree(server.process.pid), *_naming(tmp)]:
        seen.setdefault(process.pid, process)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _naming(tmp: Path) -> list[psutil.Process]:
    """Processes whose command line names ``tmp`` (the frontend's java.io.tmpdir, the
    workers' socket paths): they are this peer's even when reparented."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if any(str(tmp) in part for part in cmdline):
            found.append(process)
    return found


def _wait_ready(
    server: PeerServer,
    names: list[str],
    timeout_s: float,
    tmp: Path,
    seen: dict[int, psutil.Process],
) -> None:
    inference, management = server.urls["inference"], server.urls["management"]
    deadline = time.monotonic() + timeout_s
    waiting = "ping"
    while time.monotonic() < deadline:
        _track(server, tmp, seen)
        if server.process.poll() is not None:
            code = server.process.returncode
            raise PeerUnavailable(f"torchserve exited ({code}): {_tail(server)}")
        try:
            ping = requests.get(f"{inference}/ping", headers=_key(tmp, "inference"), timeout=5)
            waiting = f"ping {ping.status_code} {ping.text.strip()!r}"
            if ping.status_code == 200 and '"Healthy"' in ping.text:
                headers = _key(tmp, "management")
                pending = [n for n in names if not _has_ready_worker(management, n, headers)]
                waiting = f"no READY worker for {pending}"
                if not pending:
                    return
        except (requests.RequestException, ValueError) as error:
            waiting = f"{type(error).__name__}: {error}"
        time.sleep(0.5)
    raise PeerUnavailable(f"torchserve not ready in {timeout_s:.0f} s ({waiting}): {_tail(server)}")


def _key(tmp: Path, api: str) -> dict[str, str]:
    """The header ``api`` ("inference", "management") wants where token authorization
    is on (its key file, written into the directory TorchServe started in); none where
    it is off."""
    try:
        key = json.loads((tmp / "key_file.json").read_text())[api]["key"]
    except (OSError, ValueError, KeyError):
        return {}
    return {"Authorization": f"Bearer {key}"}


def _has_ready_worker(management: str, name: str, headers: dict[str, str]) -> bool:
    answer = requests.get(f"{management}/models/{name}", headers=headers, timeout=5)
    if answer.status_code != 200:
        return False
    return any(
        worker.get("status") == "READY"
        for version in answer.json()
        for worker in version.get("workers", [])
    )


def _tail(server: PeerServer) -> str:
    """The console log's last lines, without the access and metrics lines (the wait's
    own polling makes most of those)."""
    try:
        lines = server.log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    lines = [ln for ln in lines if " ACCESS_LOG - " not in ln and " TS_METRICS - " not in ln]
    return "\n".join([*lines[-LOG_TAIL_LINES:], f"(the whole console: {server.log})"])


def _stop(server: PeerServer, tmp: Path, seen: dict[int, psutil.Process]) -> None:
    """SIGTERM the Java frontend, wait for the tree, SIGKILL what is left (all by PID).

    The launcher (``server.process``) returns when the frontend exits;
    ``started`` reaps it afterwards.
    """
    _track(server, tmp, seen)
    for process in seen.values():
        with contextlib.suppress(psutil.Error):
            if process.is_running() and FRONTEND_CLASS in process.cmdline():
                process.send_signal(signal.SIGTERM)
    launcher = server.process.pid
    _gone, alive = psutil.wait_procs(_running(seen, launcher), timeout=STOP_TIMEOUT_S)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(_running(seen, launcher), timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(5)


def _sweep(tmp: Path, seen: dict[int, psutil.Process]) -> None:
    """Kill anything of this peer still running (a start that failed early included)."""
    for process in _running(seen):
        with contextlib.suppress(psutil.Error):
            process.kill()
    for process in _naming(tmp):
        seen.setdefault(process.pid, process)
        with contextlib.suppress(psutil.Error):
            process.kill()
    _gone, alive = psutil.wait_procs(_running(seen), timeout=5)
    if alive:
        print(f"torchserve: still running after stop: {[p.pid for p in alive]}", file=sys.stderr)


def _running(seen: dict[int, psutil.Process], skip: int = 0) -> list[psutil.Process]:
    """Those of ``seen`` still running (``is_running`` checks the start time too) but ``skip``
    (the launcher, which ``subprocess`` reaps: psutil must not)."""
    alive = []
    for process in seen.values():
        if process.pid == skip:
            continue
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def leftovers(server: PeerServer) -> list[int]:
    """PIDs of ``server``'s processes still running (none, after its block has ended)."""
    left = [p.pid for p in _running(server.details.get("processes", {}))]
    tmp = server.details.get("tmpdir")
    if tmp:
        left += [p.pid for p in _naming(Path(tmp))]
    return sorted(set(left))
