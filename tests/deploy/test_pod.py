"""What a pod does, run here without a container runtime or a cluster.

The image's CMD and ENV (from deploy/container/Containerfile) start the
appliance with the pod's config, in a clean run directory, as the image's
non-root user where this host lets that user run this Python, and it answers
readiness; so does the KServe runtime's command, serving a model repository
where KServe's /mnt/models would be. The Deployment's preStop command
(from deploy/kubernetes/deployment.yaml) drains a pod under KServe REST load
with no failed request: the load stops sending once readiness fails, as a
Service's endpoints do, and the drain waits until nothing is in flight.
The ports are 0 and the host loopback, where a pod has fixed ports on 0.0.0.0.
"""

from __future__ import annotations

import functools
import http.client
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from tests.deploy.manifests import ROOT, containerfile, documents
from tests.system.harness import Appliance, new_run_dir
from tests.system.traffic import Endpoints, KserveRest

CHECK_INTERVAL_S = 0.2


def pod_config(run_dir: Path, image_path: str, **models: Any) -> Path:
    """The image's config at ``image_path``, on loopback and ports 0, in ``run_dir``;
    KServe's /mnt/models is the demo repository, as a storageUri would lay it out."""
    config = tomllib.loads(containerfile().source(image_path).read_text())
    for repository in config.get("repositories", []):
        if repository["path"] == "/mnt/models":
            repository["path"] = str(ROOT / "appliance" / "demos" / "repository")
    config["server"] |= {"host": "127.0.0.1", "run_dir": str(run_dir)}
    config["server"]["python_path"] = [str(ROOT)]
    config["http"]["port"] = 0
    config["grpc"]["port"] = 0
    config["mip"]["listeners"] = [{**item, "port": 0} for item in config["mip"]["listeners"]]
    config["models"] = [*config.get("models", []), *models.values()]
    path = run_dir / "pod.toml"
    path.write_text(tomli_w.dumps(config))
    return path


@functools.cache
def pod_user() -> dict[str, Any]:
    """Popen's arguments that run as the image's user, where this test may switch to it:
    as root, and where that user can run this Python (not when it lives under /root)."""
    uid = int(containerfile().user)
    user = {"user": uid, "group": uid, "extra_groups": []}
    if os.getuid() != 0:
        return {}
    try:
        subprocess.run(
            [sys.executable, "-c", "import appliance"],
            check=True,
            cwd="/",
            env={"PYTHONPATH": str(ROOT)},
            **user,
        )
    except (OSError, subprocess.CalledProcessError) as ex:
        print(f"running as uid {os.getuid()}: uid {uid} cannot run {sys.executable} ({ex})")
        return {}
    return user


def start_pod(run_dir: Path, config_path: Path, command: list[str]) -> Appliance:
    """Start a container's command (the image's CMD, or a runtime's args) with the
    image's ENV, its config swapped for ours."""
    image = containerfile()
    assert command[0] == "appliance", "the container runs the appliance's console script"
    argv = [str(config_path) if arg == config_of(command) else arg for arg in command]
    env = {**os.environ, **image.env, "PYTHONPATH": str(ROOT)}
    user = pod_user()
    if user:
        os.chown(run_dir, user["user"], user["group"])
    log_path = run_dir.parent / f"{run_dir.name}.log"
    try:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "appliance", *argv[1:]],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=run_dir,
                env=env,
                **user,
            )
        appliance = Appliance(run_dir, process, log_path)
        try:
            appliance.wait_ready()
        except BaseException:
            appliance.stop(signal.SIGKILL)
            raise
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        log_path.unlink(missing_ok=True)
        raise
    return appliance


def config_of(command: list[str]) -> str:
    """The image path of the config a container's command names."""
    return command[command.index("--config") + 1]


def ready(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def stop(appliance: Appliance) -> None:
    try:
        assert appliance.stop() == 0, appliance.log()
        appliance.assert_clean()
    finally:
        shutil.rmtree(appliance.run_dir, ignore_errors=True)
        appliance.log_path.unlink(missing_ok=True)


def test_the_image_command_starts_the_appliance_as_its_user() -> None:
    command = containerfile().cmd
    run_dir = new_run_dir()
    appliance = start_pod(run_dir, pod_config(run_dir, config_of(command)), command)
    try:
        assert ready(appliance.ports["http"]), appliance.log()
        names = set(appliance.ctl("status")["models"])
        assert {"echo", "digits", "simple"} <= names
        if pod_user():
            uid = pod_user()["user"]
            assert os.stat(f"/proc/{appliance.process.pid}").st_uid == uid
            assert appliance.control.stat().st_uid == uid
    finally:
        stop(appliance)


def test_the_kserve_runtime_serves_the_repository_kserve_downloads() -> None:
    runtime = next(
        doc
        for doc in documents(ROOT / "deploy" / "kserve" / "servingruntime.yaml")
        if doc["kind"] == "ClusterServingRuntime"
    )
    command = runtime["spec"]["containers"][0]["args"]
    run_dir = new_run_dir()
    appliance = start_pod(run_dir, pod_config(run_dir, config_of(command)), command)
    try:
        assert ready(appliance.ports["http"]), appliance.log()
        assert set(appliance.ctl("status")["models"]) == {"digits_onnx", "digits_torch"}
    finally:
        stop(appliance)


class Balancer(threading.Thread):
    """Checks readiness every CHECK_INTERVAL_S; ``in_rotation`` follows it."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.in_rotation = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if ready(self.port):
                self.in_rotation.set()
            else:
                self.in_rotation.clear()
            self.done.wait(CHECK_INTERVAL_S)


class Load(threading.Thread):
    """KServe REST calls (tritonclient), one at a time, only while in rotation."""

    def __init__(self, balancer: Balancer, endpoints: Endpoints) -> None:
        super().__init__(daemon=True)
        self.balancer = balancer
        self.endpoints = endpoints
        self.answered = 0
        self.failures: list[str] = []

    def run(self) -> None:
        caller = KserveRest(self.endpoints)
        rng = np.random.default_rng(len(self.failures))
        while not self.balancer.done.is_set():
            if not self.balancer.in_rotation.is_set():
                time.sleep(0.02)
                continue
            x = KserveRest.example(rng)
            try:
                y = caller(x)
                assert np.array_equal(y, KserveRest.expected(x)), f"{y} for {x}"
                self.answered += 1
            except Exception as ex:
                self.failures.append(f"{type(ex).__name__}: {ex}")
        caller.close()


def test_the_prestop_hook_drains_the_pod_without_failing_a_request() -> None:
    image = containerfile()
    deployment = next(
        doc
        for doc in documents(ROOT / "deploy" / "kubernetes" / "deployment.yaml")
        if doc["kind"] == "Deployment"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    image_path = config_of(container["command"])
    run_dir = new_run_dir()
    # The pod's config, serving also a model whose replies take a while, so
    # that requests are in flight when the pod goes offline.
    slow = {"name": "slow", "class": "tests.system.faulty:Faulty", "options": {"sleep_s": 0.05}}
    config_path = pod_config(run_dir, image_path, slow=slow | {"instances": 2})
    appliance = start_pod(run_dir, config_path, container["command"])
    balancer = Balancer(appliance.ports["http"])
    loads = [Load(balancer, Endpoints(appliance.ports["http"], 0, 0, "slow")) for _ in range(4)]
    try:
        balancer.start()
        assert balancer.in_rotation.wait(10)
        for load in loads:
            load.start()
        time.sleep(1.0)
        before = sum(load.answered for load in loads)

        # The hook as the kubelet runs it, in the container: its programs are the image's.
        argv = [
            str(config_path) if arg == image_path else arg
            for arg in container["lifecycle"]["preStop"]["exec"]["command"]
        ]
        argv = [
            str(image.source(arg)) if arg in image.copies and arg != image_path else arg
            for arg in argv
        ]
        drain = subprocess.run(
            argv,
            env={**os.environ, "CTL": f"{sys.executable} -m appliance"},
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert drain.returncode == 0, drain.stdout + drain.stderr
        status = appliance.ctl("status")
        assert not status["online"]
        assert status["in_flight"] == 0
        assert not balancer.in_rotation.is_set()
        # Then the kubelet's SIGTERM: the appliance drains what is left and exits 0.
    finally:
        balancer.done.set()
        for load in loads:
            load.join(15)
        balancer.join(5)
        stop(appliance)
    answered = sum(load.answered for load in loads)
    failures = [failure for load in loads for failure in load.failures]
    print(f"preStop drain: {answered} answered ({before} before it), {len(failures)} failed")
    assert before > 0, failures[:3]
    assert not failures, failures[:5]
