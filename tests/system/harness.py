"""Start a real appliance for a test, and stop it by PID afterwards.

The appliance runs with ports 0 in a fresh short run_dir; the test learns
the ports and the tree from ``<run_dir>/appliance.json``. On teardown the
master gets SIGTERM (then SIGKILL after a bound); the test then fails if any
process it saw is still alive or any segment of the tree is left in
/dev/shm.
"""

from __future__ import annotations

import contextlib
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

import orjson
import tomli_w

from appliance.client.api import ModelClient
from appliance.core.status import Counter
from appliance.processes.control import request

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0

DEMO_MODELS = {
    "simple": "appliance.demos.simple:Simple",
    "simple_int8": "appliance.demos.simple:SimpleInt8",
    "simple_string": "appliance.demos.simple:SimpleString",
    "simple_identity": "appliance.demos.simple:SimpleIdentity",
    "identity": "appliance.demos.identity:Identity",
    "custom_identity_int32": "appliance.demos.identity:IdentityInt32",
    "forward": "appliance.demos.forward:Forward",
    "rosenbrock": "appliance.demos.rosenbrock:Rosenbrock",
    "digits": "appliance.demos.digits:Digits",
    "echo": "appliance.demos.echo:Echo",
    "repeat_int32": "appliance.demos.repeat:RepeatInt32",
    "simple_sequence": "appliance.demos.sequence:SimpleSequence",
    "simple_dyna_sequence": "appliance.demos.sequence:SimpleDynaSequence",
    "simple_string_dyna_sequence": "appliance.demos.sequence:SimpleStringDynaSequence",
}


def make_config(run_dir: Path, models: list[dict[str, Any]], **sections: Any) -> dict[str, Any]:
    """A test config: loopback, ports 0, small rings, quick drain."""
    config: dict[str, Any] = {
        "server": {
            "run_dir": str(run_dir),
            "grace_s": 0.2,
            "drain_timeout_s": 20.0,
            "stop_timeout_s": 10.0,
            "python_path": [str(ROOT)],
            "log_level": "info",
        },
        "http": {"port": 0, "workers": 1, "threads": 4},
        "grpc": {"port": 0, "workers": 1, "threads": 4},
        "mip": {"workers": 1, "listeners": [{"port": 0}]},
        "shm": {"request_ring_bytes": 8 << 20, "response_ring_bytes": 8 << 20},
        "models": models,
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    return config


def demo_models(*names: str, **overrides: dict[str, Any]) -> list[dict[str, Any]]:
    models = []
    for name in names or tuple(DEMO_MODELS):
        entry: dict[str, Any] = {"name": name, "class": DEMO_MODELS[name]}
        entry.update(overrides.get(name, {}))
        models.append(entry)
    return models


def rendezvous(where: Path, parties: int = 2) -> dict[str, Any]:
    """A ``tests.models:Rendezvous`` entry whose calls meet in ``where``.

    Its ``parties`` instances answer a gradient or a stream only once that
    many run at the same time: proof that the frontend sent them all at once.
    """
    return {
        "name": "rendezvous",
        "class": "tests.models:Rendezvous",
        "instances": parties,
        "options": {"dir": str(where), "parties": parties, "wait_s": 20.0},
    }


def eventually(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``check`` until it holds or ``timeout_s`` passes; return its last answer."""
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(interval_s)
    return check()


def counted(
    client: ModelClient,
    model: str,
    successes: int,
    before: dict[Counter, int] | None = None,
    timeout_s: float = 10.0,
) -> dict[Counter, int]:
    """``model``'s counters once ``successes`` requests are counted in them (since ``before``).

    A model worker adds a batch to its counters after it sent the batch's
    replies, and publishes them a moment later: read as soon as the replies
    came, the counters may lack the last batches. The caller still checks
    the counts it returns, so too many is caught as well as too few.
    """
    base = before[Counter.SUCCESS] if before is not None else 0
    eventually(lambda: client.counters(model)[Counter.SUCCESS] - base >= successes, timeout_s)
    return client.counters(model)


@dataclass
class Appliance:
    """A running appliance started by a test."""

    run_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    state: dict[str, Any] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    clients: list[ModelClient] = field(default_factory=list)
    # The log as it was when serving() removed the run directory.
    final_log: str | None = None

    @property
    def tree(self) -> str:
        return str(self.state["tree"])

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.state["ports"])

    @property
    def control(self) -> Path:
        return Path(self.state["control_socket"])

    def ctl(self, command: str) -> dict[str, Any]:
        return request(self.control, command)

    def client(self, **kwargs: Any) -> ModelClient:
        client = ModelClient.connect(self.run_dir, **kwargs)
        self.clients.append(client)
        return client

    def log(self) -> str:
        if self.final_log is not None:
            return self.final_log
        return self.log_path.read_text(errors="replace")

    def kserve_state(self, model: str) -> tuple[bool, dict[str, Any]]:
        """``model``'s readiness and its repository index entry, as tritonclient sees them."""
        import tritonclient.http as httpclient

        rest = httpclient.InferenceServerClient(f"127.0.0.1:{self.ports['http']}")
        try:
            ready = rest.is_model_ready(model)
            index = {entry["name"]: entry for entry in rest.get_model_repository_index()}
        finally:
            rest.close()
        return ready, index[model]

    def processes(self) -> list[dict[str, Any]]:
        return list(self.ctl("status")["processes"])

    def pid_of(self, role: str) -> int:
        for process in self.processes():
            if process["role"] == role and process["pid"]:
                return int(process["pid"])
        raise LookupError(f"no running process {role!r}")

    def remember_pids(self) -> None:
        with contextlib.suppress(Exception):
            self.pids.update(p["pid"] for p in self.processes() if p["pid"])

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        state_path = self.run_dir / "appliance.json"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"appliance exited with {self.process.returncode}:\n{self.log()}"
                )
            with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError):
                self.state = orjson.loads(state_path.read_bytes())
                if self.state.get("settled"):
                    self.remember_pids()
                    return
            time.sleep(0.05)
        raise TimeoutError(f"appliance not ready after {timeout_s} s:\n{self.log()}")

    def segments(self) -> list[str]:
        return sorted(p.name for p in Path("/dev/shm").glob(f"appliance-{self.tree}-*"))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop the master by PID and wait; return its exit code."""
        self.remember_pids()
        for client in self.clients:
            client.close()
        self.clients.clear()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def assert_clean(self) -> None:
        """Every process seen is gone and no segment of the tree remains."""
        deadline = time.monotonic() + 10.0
        alive = self.pids
        while time.monotonic() < deadline:
            alive = {pid for pid in self.pids if _alive(pid)}
            if not alive:
                break
            time.sleep(0.05)
        leftover = self.segments() if self.state else []
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not alive, f"processes still alive after stop: {sorted(alive)}"
        assert not leftover, f"shared-memory segments left: {leftover}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def start(
    config: dict[str, Any],
    wait: bool = True,
    env: dict[str, str] | None = None,
    affinity: set[int] | None = None,
    ready_timeout_s: float = START_TIMEOUT_S,
    wrap: tuple[str, ...] = (),
    serve_args: tuple[str, ...] = (),
    cwd: Path = ROOT,
) -> Appliance:
    """Start an appliance; ``affinity``: the CPUs its tree may use (as ``taskset``);
    ``wrap``: a command that execs ``appliance serve`` (its arguments follow it);
    ``serve_args``: ``appliance serve``'s arguments in place of ``--config``
    (``config`` then only says where its run directory will be); ``cwd``: where
    it runs, and so which ``appliance`` package ``python -m`` finds first."""
    run_dir = Path(config["server"]["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.toml"
    config_path.write_text(tomli_w.dumps(config))
    log_path = run_dir / "appliance.log"
    arguments = serve_args or ("--config", str(config_path))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*wrap, sys.executable, "-m", "appliance", "serve", *arguments],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            preexec_fn=None if affinity is None else lambda: os.sched_setaffinity(0, affinity),
        )
    appliance = Appliance(run_dir, process, log_path)
    if wait:
        try:
            appliance.wait_ready(ready_timeout_s)
        except BaseException:
            appliance.stop(signal.SIGKILL)
            raise
    return appliance


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports free now, for configs that must name their ports."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def new_run_dir() -> Path:
    # Short, because unix socket paths under it are limited to 107 bytes.
    return Path(tempfile.mkdtemp(prefix="ap-", dir="/tmp"))


@contextlib.contextmanager
def running(
    models: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    affinity: set[int] | None = None,
    cwd: Path = ROOT,
    **sections: Any,
) -> Iterator[Appliance]:
    """Run an appliance for the duration of a ``with`` block (``cwd``: see :func:`start`)."""
    config = make_config(new_run_dir(), models, **sections)
    with serving(config, env=env, affinity=affinity, cwd=cwd) as appliance:
        yield appliance


@contextlib.contextmanager
def serving(
    config: dict[str, Any],
    env: dict[str, str] | None = None,
    affinity: set[int] | None = None,
    ready_timeout_s: float = START_TIMEOUT_S,
    wrap: tuple[str, ...] = (),
    cwd: Path = ROOT,
) -> Iterator[Appliance]:
    """Run an appliance with ``config`` (from :func:`make_config`) for a ``with`` block;
    afterwards it is stopped, checked clean, and its run directory removed."""
    run_dir = Path(config["server"]["run_dir"])
    try:
        appliance = start(
            config,
            env=env,
            affinity=affinity,
            ready_timeout_s=ready_timeout_s,
            wrap=wrap,
            cwd=cwd,
        )
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    try:
        yield appliance
    finally:
        try:
            appliance.stop()
            appliance.assert_clean()
        finally:
            with contextlib.suppress(OSError):
                appliance.final_log = appliance.log()
            shutil.rmtree(run_dir, ignore_errors=True)


@contextlib.contextmanager
def serving_repository(path: Path) -> Iterator[Appliance]:
    """:func:`serving` an appliance whose models are the repository at ``path`` alone."""
    config = make_config(new_run_dir(), [])
    config["repositories"] = [{"path": str(path)}]
    with serving(config) as started:
        yield started


@contextlib.contextmanager
def copied_repository(source: Path, prefix: str = "repo-") -> Iterator[Path]:
    """A copy of the model repository at ``source`` for a ``with`` block, removed after.

    Not under a run_dir: the master sweeps stale directories there. A copy, so
    that what a test adds or a model writes stays out of the checkout.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        shutil.copytree(source, root, dirs_exist_ok=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
