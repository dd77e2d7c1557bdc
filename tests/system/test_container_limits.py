"""A container's other limits: descriptors, memory, a full disk for the log.

- ``ulimit -n 64`` (soft and hard: the master cannot raise it) while a client
  opens 200 connections to each of the HTTP, gRPC and MIP ports and holds
  them: every frontend admits what leaves it descriptors for its work and
  closes the rest at once; nothing dies, a connection opened before keeps
  being served, and once the 600 go every protocol answers again.
- A memory cgroup with a limit a model outgrows: the kernel's OOM killer takes
  its worker, which is reported as such and restarted.
- The log on a full filesystem: every protocol answers, nothing dies.

The memory and log tests need root (a cgroup, a mount namespace) and skip
with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.system import protocol_load
from tests.system.harness import Appliance, make_config, new_run_dir, serving
from tests.system.test_exhaustion import WHY_NOT

MiB = 1 << 20

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

LIMIT = 64
CONNECTIONS = 200


@pytest.fixture
def limited() -> Iterator[Appliance]:
    sections = {**protocol_load.SECTIONS, "http": {"workers": 1}}
    config = make_config(new_run_dir(), [protocol_load.scaled(2.0, delay_s=0.0)], **sections)
    wrap = ("sh", "-c", f'ulimit -n {LIMIT} && exec "$0" "$@"')
    with serving(config, wrap=wrap) as appliance:
        yield appliance


def hold(ports: dict[str, int]) -> list[socket.socket]:
    """Open CONNECTIONS connections to each port and keep them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = len(ports) * CONNECTIONS + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted), hard))
    held = []
    for port in ports.values():
        for _ in range(CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    return held


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (after any bytes it sent: MIP's error frame)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def eventually_answers(app: Appliance, name: str, timeout_s: float = 30.0) -> None:
    call, close = protocol_load.CLIENTS[name](app, "scaled")
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                assert (call(x) == 2.0 * x).all()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        close()


def test_at_the_descriptor_limit_new_connections_are_closed_and_counted_nothing_dies(
    limited: Appliance,
) -> None:
    before = {p["role"]: p["pid"] for p in limited.processes()}
    mip_port = int(limited.state["mip_listeners"][0]["port"])
    ports = {"http": limited.ports["http"], "grpc": limited.ports["grpc"], "mip": mip_port}
    kept = requests.Session()
    url = f"http://127.0.0.1:{limited.ports['http']}/v2/health/ready"
    assert kept.get(url, timeout=10).status_code == 200
    held = hold(ports)
    try:
        time.sleep(1.0)
        # A connection opened before keeps being served.
        assert kept.get(url, timeout=10).status_code == 200
        refused = sum(closed_by_server(sock) for sock in held)
        # Each frontend process holds at most its limit; the rest were closed.
        assert refused >= len(held) - 3 * LIMIT, refused
    finally:
        for sock in held:
            sock.close()
        kept.close()
    for name in protocol_load.CLIENTS:
        eventually_answers(limited, name)
    after = limited.processes()
    assert {p["role"]: p["pid"] for p in after} == before
    assert all(p["restarts"] == 0 for p in after), after
    log = limited.log()
    assert "was killed by" not in log
    # Logged once per process that refused, however many it refused.
    for protocol in ("http", "mip"):
        lines = [
            line for line in log.splitlines() if f"{protocol}: at the descriptor limit" in line
        ]
        assert len(lines) == 1, lines
    metrics = requests.get(f"http://127.0.0.1:{limited.ports['http']}/metrics", timeout=10).text
    counts = dict(
        re.findall(r'appliance_connections_refused_total\{protocol="(\w+)"\} (\S+)', metrics)
    )
    assert float(counts.get("http", 0)) > 0, counts
    assert float(counts.get("mip", 0)) > 0, counts


def _memory_cgroup(limit: int) -> Path | None:
    """A memory cgroup (v1 or v2) under this process's own, limited to ``limit`` bytes."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent, limit_file = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), "limit_in_bytes"
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            parent, limit_file = Path("/sys/fs/cgroup") / path.lstrip("/"), "max"
        else:
            continue
        group = parent / f"appliance-test-{os.getpid()}"
        try:
            group.mkdir()
            (group / f"memory.{limit_file}").write_text(str(limit))
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
            continue
        return group
    return None


def test_a_model_worker_the_oom_killer_takes_is_reported_as_such_and_restarted() -> None:
    group = _memory_cgroup(768 * MiB)
    if group is None:
        pytest.skip("no memory cgroup can be made here (needs root and a writable cgroupfs)")
    enter = f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"'
    models = [{"name": "slow", "class": "tests.models:Slow"}]
    try:
        with serving(make_config(new_run_dir(), models), wrap=("sh", "-c", enter)) as app:
            rest = httpclient.InferenceServerClient(f"127.0.0.1:{app.ports['http']}")
            try:
                tensor = httpclient.InferInput("x", [1], "FP32")
                tensor.set_data_from_numpy(np.ones(1, np.float32))
                with pytest.raises(InferenceServerException):
                    rest.infer("slow", [tensor], parameters={"hog_mib": 1024})
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    row = next(p for p in app.processes() if p["model"] == "slow")
                    if row["restarts"] and row["state"] == "ready":
                        break
                    time.sleep(0.2)
                assert row["state"] == "ready", row
                assert row["restarts"] == 1, row
                assert "out of memory, killed by the kernel's OOM killer" in row["last_exit"], row
                assert "RSS" in row["last_exit"], row
                assert rest.infer("slow", [tensor]).as_numpy("y").tolist() == [1.0]
            finally:
                rest.close()
        log = app.log()
        assert "was killed by SIGKILL: out of memory" in log, log[-3000:]
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
def test_a_full_disk_under_the_log_loses_lines_not_requests() -> None:
    sections = {**protocol_load.SECTIONS, "http": {"workers": 1}}
    config = make_config(new_run_dir(), [protocol_load.scaled(2.0, delay_s=0.0)], **sections)
    logs = Path(config["server"]["run_dir"]) / "logs"
    logs.mkdir(parents=True)
    # The log's filesystem is full before the appliance writes its first line.
    fill = (
        f"mount -t tmpfs -o size=1m tmpfs {logs} && fallocate -l 1m {logs}/filler; "
        f'exec "$0" "$@" > {logs}/appliance.log 2>&1'
    )
    with serving(config, wrap=("unshare", "-m", "--", "sh", "-c", fill)) as app:
        x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
        for name, connect in protocol_load.CLIENTS.items():
            call, close = connect(app, "scaled")
            try:
                for _ in range(20):
                    assert (call(x) == 2.0 * x).all(), name
            finally:
                close()
        processes = app.processes()
        assert all(p["restarts"] == 0 for p in processes), processes
        assert app.ctl("status")["ready"]
    assert app.process.returncode == 0
