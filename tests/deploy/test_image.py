"""The container image, built with `make image` and run as a pod would run it.

buildah builds deploy/container/Containerfile without a daemon, on the base
that `make image-base` makes from Debian's packages when this host has no
registry, and without the model runtimes (the pod's config serves the Python
demos). The appliance then runs inside it with buildah's chroot isolation
(podman's runtime needs cgroups this sandbox lacks): as the image's user,
uid 10001, on the host's network and /dev/shm, serving deploy/container/pod.toml
with its ports moved to free ones on the loopback. tritonclient (REST and
gRPC) and umbridge call it from outside the chroot; SIGTERM drains it and it
leaves no segment behind. Another user's appliance on the host (a lock file
of root's) must not keep it from starting.

Marked ``image``: minutes of building, so `make test-image` runs it, not
`make test`; it skips, with the reason, where buildah or root is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tomli_w
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import umbridge

from tests.deploy.manifests import ROOT
from tests.system.harness import free_ports

# Building the base and the image takes minutes on a fresh host.
pytestmark = [pytest.mark.image, pytest.mark.timeout(1200)]

IMAGE = "localhost/appliance:test-image"
LOCAL_BASE = "localhost/appliance-base:bookworm"
POD_CONFIG = ROOT / "deploy" / "container" / "pod.toml"
IMAGE_USER = 10001
START_TIMEOUT_S = 120.0


def buildah(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["buildah", *args], capture_output=True, text=True, check=check)


def registry_reachable() -> bool:
    """Whether buildah can pull python:3.12-slim's manifest (a registry answers)."""
    done = subprocess.run(
        ["buildah", "pull", "--quiet", "docker.io/library/python:3.12-slim"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode == 0


def make(*args: str) -> None:
    done = subprocess.run(["make", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"make {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if shutil.which("buildah") is None:
        pytest.skip("buildah is not installed (apt-get install buildah)")
    if os.geteuid() != 0:
        pytest.skip("buildah's chroot isolation needs root here")
    base = "docker.io/library/python:3.12-slim"
    if not registry_reachable():
        if not buildah("images", "--quiet", LOCAL_BASE, check=False).stdout.strip():
            if shutil.which("mmdebstrap") is None:
                pytest.skip("no registry, and mmdebstrap is missing for make image-base")
            make("image-base")
        base = LOCAL_BASE
    cert = os.environ.get("PIP_CERT", "")
    make(
        "image",
        f"IMAGE={IMAGE}",
        f"IMAGE_BASE={base}",
        "IMAGE_EXTRAS=",
        *([f"PIP_CERT={cert}"] if cert else []),
    )
    yield IMAGE
    buildah("rmi", "--force", IMAGE, check=False)


class Running:
    """The appliance in a working container of the image."""

    def __init__(self, image: str, config_dir: Path) -> None:
        self.container = buildah("from", "--quiet", image).stdout.strip()
        self.log = config_dir / "appliance.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    "buildah",
                    "run",
                    "--isolation",
                    "chroot",
                    "--user",
                    str(IMAGE_USER),
                    "--volume",
                    f"{config_dir}:/etc/test:ro",
                    self.container,
                    "--",
                    "appliance",
                    "serve",
                    "--config",
                    "/etc/test/pod.toml",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def master(self) -> psutil.Process:
        """The appliance's master: the `appliance serve` process under buildah."""
        for child in psutil.Process(self.process.pid).children(recursive=True):
            command = child.cmdline()
            # buildah-chroot-exec, which runs the command in the chroot, names it too.
            if "serve" in command and not command[0].startswith("buildah"):
                return child
        raise LookupError(f"no appliance master under buildah:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        buildah("rm", self.container, check=False)


def segments_of(uid: int) -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("appliance-*") if p.stat().st_uid == uid}


def wait_ready(url: str, running: Running) -> None:
    client = httpclient.InferenceServerClient(url)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            assert running.process.poll() is None, running.log.read_text()
            try:
                if client.is_server_ready():
                    return
            except Exception:
                pass
            time.sleep(0.5)
    finally:
        client.close()
    raise AssertionError(f"not ready in {START_TIMEOUT_S} s:\n{running.log.read_text()}")


def test_the_image_serves_the_pod_config_as_its_user_and_drains_on_sigterm(image: str) -> None:
    config = tomllib.loads(POD_CONFIG.read_text())
    http, grpc, mip = free_ports(3)
    config["server"]["host"] = "127.0.0.1"
    config["http"]["port"], config["grpc"]["port"] = http, grpc
    config["mip"]["listeners"][0]["port"] = mip
    config_dir = Path(tempfile.mkdtemp(prefix="image-", dir="/tmp"))
    os.chmod(config_dir, 0o755)
    (config_dir / "pod.toml").write_text(tomli_w.dumps(config))
    # Root's appliance elsewhere on the host: its lock is 0600, unreadable to uid 10001.
    foreign = Path("/dev/shm/appliance-0badc0de-lock")
    foreign.write_bytes(b"1\n")
    foreign.chmod(0o600)
    before = segments_of(IMAGE_USER)
    running = Running(image, config_dir)
    try:
        wait_ready(f"127.0.0.1:{http}", running)
        master = running.master()
        master_uid = master.uids().real
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        sums = []
        for module, port in ((httpclient, http), (grpcclient, grpc)):
            client = module.InferenceServerClient(f"127.0.0.1:{port}")
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            sums.append(client.infer("simple", inputs).as_numpy("OUTPUT0"))
            client.close()
        model = umbridge.HTTPModel(f"http://127.0.0.1:{http}", "digits")
        probabilities = model([[0.0] * 64])[0]
        assert segments_of(IMAGE_USER) - before, "no segment of the image's user while serving"
        master.send_signal(signal.SIGTERM)
        code = running.process.wait(60)
    finally:
        running.stop()
        foreign.unlink(missing_ok=True)
        log = running.log.read_text(errors="replace")
        shutil.rmtree(config_dir, ignore_errors=True)
    assert [s.tolist() for s in sums] == [(a + b).tolist()] * 2
    assert len(probabilities) == 10
    assert abs(sum(probabilities) - 1.0) < 1e-6
    assert master_uid == IMAGE_USER
    assert code == 0, log
    assert segments_of(IMAGE_USER) - before == set(), log
    # make image compiles the request path (a compiler from the base's apt sources).
    assert "request path (model workers and frontends): compiled (mypyc)" in log, log
