"""A container's small /dev/shm: the appliance serves what fits or says why it cannot.

Each appliance runs in a private mount namespace whose /dev/shm is a small
tmpfs (``unshare -m``, as root; skipped with the reason where that is not
allowed), as in a container started without ``--shm-size`` (64 MiB). Its
segments live and die with that namespace. Clients reach it over loopback
TCP, which the namespace shares.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.system import traffic
from tests.system.harness import ROOT, Appliance, make_config, new_run_dir, serving, start

DEFAULTS = tomllib.loads((ROOT / "appliance" / "default.toml").read_text())
MiB = 1 << 20


def _namespaces_allowed() -> str:
    """Why a private /dev/shm cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs in a private mount namespace needs root"
    try:
        done = subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as ex:
        return f"unshare cannot run: {ex}"
    return "" if done.returncode == 0 else f"unshare -m refused: {done.stderr.decode().strip()}"


WHY_NOT = _namespaces_allowed()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


def small_shm(mib: int) -> tuple[str, ...]:
    """A command prefix that runs the rest with a /dev/shm of ``mib`` MiB of its own."""
    mount = f'mount -t tmpfs -o size={mib}m tmpfs /dev/shm && exec "$0" "$@"'
    return ("unshare", "-m", "--", "sh", "-c", mount)


def default_config(run_dir: Path) -> dict[str, Any]:
    """appliance/default.toml as `make run` serves it, on ports 0 in ``run_dir``."""
    config = make_config(
        run_dir,
        DEFAULTS["models"],
        server={"default_model": DEFAULTS["server"]["default_model"]},
        http={"graphpipe_model": DEFAULTS["http"]["graphpipe_model"], "workers": "auto"},
        grpc={"workers": "auto"},
        mip={"workers": "auto"},
    )
    config["shm"] = dict(DEFAULTS["shm"])
    config["repositories"] = [
        {**repo, "path": str(ROOT / "appliance" / repo["path"])}
        for repo in DEFAULTS["repositories"]
    ]
    return config


def shm_dir(appliance: Appliance) -> Path:
    """The appliance's own /dev/shm, seen from outside its namespace."""
    return Path(f"/proc/{appliance.process.pid}/root/dev/shm")


def identity(client: Any, module: Any, floats: int) -> np.ndarray:
    values = np.arange(floats, dtype=np.float32)
    tensor = module.InferInput("INPUT0", [1, floats], "FP32")
    tensor.set_data_from_numpy(values.reshape(1, -1))
    result = client.infer("identity", [tensor]).as_numpy("OUTPUT0")
    assert np.array_equal(result.ravel(), values)
    return result


def no_child_killed(log: str) -> None:
    """No process died of a signal but the SIGTERM of its stop."""
    assert "SIGBUS" not in log, log[-4000:]
    killed = [line for line in log.splitlines() if "was killed by" in line]
    assert all("was killed by SIGTERM" in line for line in killed), killed


def test_sixteen_mib_refuses_to_start_and_says_what_to_change() -> None:
    run_dir = new_run_dir()
    appliance = start(default_config(run_dir), wait=False, wrap=small_shm(16))
    try:
        code = appliance.process.wait(60)
        log = appliance.log()
    finally:
        if appliance.process.poll() is None:
            appliance.process.kill()
            appliance.process.wait()
    assert code == 1, log
    no_child_killed(log)
    refusal = [line for line in log.splitlines() if "cannot start" in line]
    assert len(refusal) == 1, log
    line = refusal[0]
    # How much is needed, how much is there, and what to change.
    assert "/dev/shm has 16 MiB free of 16 MiB" in line, line
    for advice in ("at least", "--shm-size=", "shm.request_ring_bytes", "shm.min_ring_bytes"):
        assert advice in line, line
    assert "fewer model instances" in line, line


@pytest.mark.parametrize("size", [64, 256])
def test_the_default_config_serves_every_model_in_a_small_dev_shm(size: int) -> None:
    with serving(default_config(new_run_dir()), wrap=small_shm(size)) as appliance:
        status = appliance.ctl("status")
        log = appliance.log()
        assert status["ready"], status
        assert all(p["state"] == "ready" for p in status["processes"] if p["model"]), status
        shm = status["shm"]
        assert shm["total_bytes"] == size * MiB
        assert 0 < shm["ring_cap_bytes"] < 32 * MiB
        assert 0 < shm["tree_bytes"] <= size * MiB
        assert "every ring is capped at" in log
        assert "--shm-size=" in log
        rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
        try:
            for client, module in ((rest, httpclient), (grpc, grpcclient)):
                identity(client, module, 16)
                # Larger than any ring now: a one-off segment each way.
                identity(client, module, 4 * MiB // 4 + 1)
        finally:
            rest.close()
            grpc.close()
        assert all(p["restarts"] == 0 for p in appliance.processes()), appliance.processes()
    no_child_killed(appliance.log())


class Load(traffic.Background):
    """Clients calling identity in a loop over KServe REST and gRPC, counting outcomes."""

    def __init__(self, appliance: Appliance, floats: int) -> None:
        super().__init__()
        self.ports = appliance.ports
        self.floats = floats
        self.passed = 0
        self.failures: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(module,), daemon=True)
            for module in (httpclient, grpcclient)
        ]

    def _run(self, module: Any) -> None:
        port = self.ports["http" if module is httpclient else "grpc"]
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            while not self.stop.is_set():
                try:
                    identity(client, module, self.floats)
                    self.passed += 1
                except (InferenceServerException, AssertionError) as ex:
                    self.failures.append(str(ex))
        finally:
            client.close()


def fill(directory: Path) -> list[Path]:
    """Fill ``directory``'s filesystem to the last page; return the files made."""
    fillers = []
    for index in range(8):
        stat = os.statvfs(directory)
        free = stat.f_bavail * stat.f_frsize
        if free == 0:
            break
        path = directory / f"filler-{index}"
        fillers.append(path)
        subprocess.run(["fallocate", "-l", str(free), str(path)], check=False)
    return fillers


@pytest.fixture
def tight() -> Iterator[Appliance]:
    """identity and simple with 8 MiB rings in a 64 MiB /dev/shm."""
    models = [
        {"name": "identity", "class": "appliance.demos.identity:Identity"},
        {"name": "simple", "class": "appliance.demos.simple:Simple"},
    ]
    config = make_config(new_run_dir(), models)
    with serving(config, wrap=small_shm(64)) as appliance:
        yield appliance


def test_a_full_dev_shm_fails_only_what_needs_more_and_nothing_restarts(
    tight: Appliance,
) -> None:
    big = 12 * MiB // 4  # floats: more than the 8 MiB rings, a one-off segment
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{tight.ports['http']}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{tight.ports['grpc']}")
    pids = {p["role"]: p["pid"] for p in tight.processes()}
    fillers: list[Path] = []
    try:
        identity(rest, httpclient, big)
        with Load(tight, 64 << 10) as load:
            time.sleep(0.5)
            fillers = fill(shm_dir(tight))
            passed_before = load.passed
            for client, module in ((rest, httpclient), (grpc, grpcclient)):
                with pytest.raises(InferenceServerException) as refused:
                    identity(client, module, big)
                text = str(refused.value)
                assert "shared memory is full" in text, text
                assert ("429" in text) if module is httpclient else ("RESOURCE_EXHAUSTED" in text)
            time.sleep(1.0)
            for path in fillers:
                path.unlink()
            fillers = []
            time.sleep(0.5)
        # Requests that fit the rings kept passing, through the fill and after it.
        assert load.failures == [], load.failures[:3]
        assert load.passed > passed_before > 0
        for client, module in ((rest, httpclient), (grpc, grpcclient)):
            identity(client, module, big)
    finally:
        for path in fillers:
            path.unlink(missing_ok=True)
        rest.close()
        grpc.close()
    after = tight.processes()
    assert {p["role"]: p["pid"] for p in after} == pids
    assert all(p["restarts"] == 0 for p in after), after
    no_child_killed(tight.log())


def test_a_model_loaded_on_a_full_dev_shm_fails_naming_it_then_loads_once_there_is_room(
    tight: Appliance,
) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{tight.ports['http']}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{tight.ports['grpc']}")
    fillers: list[Path] = []
    try:
        rest.unload_model("simple")
        fillers = fill(shm_dir(tight))
        for client in (rest, grpc):
            with pytest.raises(InferenceServerException) as refused:
                client.load_model("simple")
            text = str(refused.value)
            assert "failed to load model simple" in text
            assert "shared memory is full" in text
            assert ("429" in text) if client is rest else ("RESOURCE_EXHAUSTED" in text), text
        # The other model serves on, its instance never restarted.
        identity(rest, httpclient, 16)
        for path in fillers:
            path.unlink()
        fillers = []
        rest.load_model("simple")
        assert rest.is_model_ready("simple")
    finally:
        for path in fillers:
            path.unlink(missing_ok=True)
        rest.close()
        grpc.close()
    identity_row = next(p for p in tight.processes() if p["model"] == "identity")
    assert identity_row["restarts"] == 0
