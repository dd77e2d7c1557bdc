"""Real clients calling one model in a loop over every protocol; readiness probes.

The drain and reload tests drive ``tests.models:Scaled`` (y = factor * x,
x FP32 [1, 4]) with each protocol's stock client, one thread per protocol,
and count what succeeds and what fails; a reply that is not factor * x for
one factor counts as a failure too. The factors each protocol saw, in
order, show when a reload took effect. :class:`Readiness` asks every
protocol's readiness endpoint and measures how long a change takes.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import umbridge
from graphpipe import remote
from kubemo.client import Client as KubemoClient
from kubemo.serialize import Json

from appliance._generated import grps_pb2, grps_pb2_grpc, health_pb2, health_pb2_grpc
from tests.system.harness import Appliance

Array = np.ndarray[Any, Any]
Call = Callable[[Array], Array]
Connection = tuple[Call, Callable[[], None]]


def scaled(factor: float, instances: int = 1, delay_s: float = 0.02) -> dict[str, Any]:
    """A ``[[models]]`` entry for the Scaled test model named ``scaled``."""
    return {
        "name": "scaled",
        "class": "tests.models:Scaled",
        "instances": instances,
        "options": {"factor": factor, "delay_s": delay_s},
    }


# Every protocol's sections for an appliance that serves ``scaled`` everywhere.
SECTIONS: dict[str, Any] = {
    "server": {"default_model": "scaled", "grace_s": 1.0},
    "http": {"workers": 2},
    "mip": {"listeners": [{"port": 0, "model": "scaled"}]},
}


# -- one stock client per protocol; each returns (call, close) ---------------------


def kserve_rest(app: Appliance, model: str) -> Connection:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{app.ports['http']}")

    def call(x: Array) -> Array:
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return np.asarray(client.infer(model, [tensor]).as_numpy("y"))

    return call, client.close


def kserve_grpc(app: Appliance, model: str) -> Connection:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{app.ports['grpc']}")

    def call(x: Array) -> Array:
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return np.asarray(client.infer(model, [tensor], client_timeout=30).as_numpy("y"))

    return call, client.close


def grps_rest(app: Appliance, model: str) -> Connection:
    session = requests.Session()
    url = f"http://127.0.0.1:{app.ports['http']}/grps/v1/infer/predict?return-ndarray=true"

    def call(x: Array) -> Array:
        reply = session.post(url, json={"model": model, "ndarray": x.tolist()}, timeout=30)
        reply.raise_for_status()
        return np.asarray(reply.json()["ndarray"], dtype=np.float32)

    return call, session.close


def grps_grpc(app: Appliance, model: str) -> Connection:
    channel = grpc.insecure_channel(f"127.0.0.1:{app.ports['grpc']}")
    stub = grps_pb2_grpc.GrpsServiceStub(channel)

    def call(x: Array) -> Array:
        request = grps_pb2.GrpsMessage(model=model)
        request.gtensors.tensors.add(
            name="x", dtype=grps_pb2.DT_FLOAT32, shape=list(x.shape), flat_float32=x.ravel()
        )
        reply = stub.Predict(request, timeout=30)
        if reply.status.code != 200:
            raise RuntimeError(f"GRPS status {reply.status.code}: {reply.status.msg}")
        [tensor] = reply.gtensors.tensors
        return np.asarray(tensor.flat_float32, dtype=np.float32).reshape(tuple(tensor.shape))

    return call, channel.close


def graphpipe(app: Appliance, model: str) -> Connection:
    url = f"http://127.0.0.1:{app.ports['http']}/graphpipe/{model}"
    return (lambda x: np.asarray(remote.execute(url, x))), (lambda: None)


def um_bridge(app: Appliance, model: str) -> Connection:
    client = umbridge.HTTPModel(f"http://127.0.0.1:{app.ports['http']}", model)

    def call(x: Array) -> Array:
        [y] = client([x.ravel().tolist()])
        return np.asarray(y, dtype=np.float32).reshape(x.shape)

    return call, lambda: None


def mip_url(app: Appliance, model: str) -> str:
    port = next(int(x["port"]) for x in app.state["mip_listeners"] if x["model"] == model)
    return f"tcp://127.0.0.1:{port}"


def mip(app: Appliance, model: str) -> Connection:
    url = mip_url(app, model)

    def call(x: Array) -> Array:
        # PROTOCOL-FACTS §4.3: the stock Json(obj) is broken; Json over bytes works.
        item = Json(io.BytesIO(json.dumps(x.ravel().tolist()).encode()))
        [[y]] = KubemoClient().inference(url, ((item,),))
        return np.asarray(y.decode(), dtype=np.float32).reshape(x.shape)

    return call, lambda: None


CLIENTS: dict[str, Callable[[Appliance, str], Connection]] = {
    "kserve-rest": kserve_rest,
    "kserve-grpc": kserve_grpc,
    "grps-rest": grps_rest,
    "grps-grpc": grps_grpc,
    "graphpipe": graphpipe,
    "umbridge": um_bridge,
    "mip": mip,
}


class ProtocolLoad:
    """One thread per protocol calling ``model`` with x = [[1, 2, 3, 4]] in a loop."""

    def __init__(self, app: Appliance, model: str = "scaled") -> None:
        self.app = app
        self.model = model
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.successes: Counter[str] = Counter()
        self.failures: list[str] = []
        self.in_flight = 0
        self.seen: dict[str, list[float]] = {name: [] for name in CLIENTS}
        self.threads = [
            threading.Thread(target=self.loop, args=(name,), name=name) for name in CLIENTS
        ]

    def loop(self, name: str) -> None:
        x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
        try:
            call, close = CLIENTS[name](self.app, self.model)
        except Exception as ex:
            self.failures.append(f"{name}: connect: {ex!r}")
            return
        try:
            while not self.stop.is_set():
                self.once(name, call, x)
        finally:
            close()

    def once(self, name: str, call: Call, x: Array) -> None:
        with self.lock:
            self.in_flight += 1
        try:
            y = call(x)
            factor = float(y.ravel()[0])
            if y.shape != x.shape or not np.allclose(y, factor * x):
                raise AssertionError(f"not a multiple of {x.tolist()}: {y.tolist()}")
        except Exception as ex:
            with self.lock:
                self.failures.append(f"{name}: {ex!r}")
        else:
            with self.lock:
                self.successes[name] += 1
                if not self.seen[name] or self.seen[name][-1] != factor:
                    self.seen[name].append(factor)
        finally:
            with self.lock:
                self.in_flight -= 1

    def wait_each(self, more: int, timeout_s: float = 30.0) -> None:
        """Wait until every protocol has ``more`` further successes."""
        with self.lock:
            target = {name: self.successes[name] + more for name in CLIENTS}
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                behind = {n: self.successes[n] for n in CLIENTS if self.successes[n] < target[n]}
                failures = list(self.failures)
            if not behind:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"protocols behind after {timeout_s} s: {behind}; {failures}")
            time.sleep(0.02)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in self.threads)

    def __enter__(self) -> ProtocolLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.join()


# -- readiness on every protocol ------------------------------------------------------

PONG = bytes([0, 1, 1, 0, 0, 0, 0, 0])


class Readiness:
    """Ask each protocol whether the host is ready (each probe returns a bool)."""

    def __init__(self, app: Appliance) -> None:
        self.app = app
        self.triton = grpcclient.InferenceServerClient(f"127.0.0.1:{app.ports['grpc']}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{app.ports['grpc']}")
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.grps = grps_pb2_grpc.GrpsServiceStub(self.channel)
        self.probes: dict[str, Callable[[], bool]] = {
            "kserve-rest /v2/health/ready": lambda: self.http("/v2/health/ready"),
            "kserve-grpc ServerReady": lambda: bool(self.triton.is_server_ready(client_timeout=5)),
            "grpc.health.v1 Check": self.grpc_health,
            "grps-rest /grps/v1/health/ready": lambda: self.http("/grps/v1/health/ready"),
            "grps-grpc CheckReadiness": self.grps_ready,
            "mip ping": self.mip_ping,
        }

    def http(self, path: str) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.app.ports["http"], timeout=5)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            return response.status == 200
        finally:
            conn.close()

    def grpc_health(self) -> bool:
        reply = self.health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def grps_ready(self) -> bool:
        return bool(self.grps.CheckReadiness(grps_pb2.GrpsMessage(), timeout=5).status.code == 200)

    def mip_ping(self) -> bool:
        url = mip_url(self.app, "scaled").removeprefix("tcp://")
        host, port = url.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(struct.pack("!4BL", 0, 1, 0, 0, 0))
            return conn.recv(8) == PONG

    def states(self) -> dict[str, bool]:
        return {name: probe() for name, probe in self.probes.items()}

    def time_until(self, ready: bool, since: float, limit_s: float = 3.0) -> dict[str, float]:
        """Seconds from ``since`` until each probe answered ``ready``, polled every 20 ms.

        A probe that never does within ``limit_s`` gets ``inf``.
        """
        times: dict[str, float] = {}
        while len(times) < len(self.probes):
            for name, probe in self.probes.items():
                if name not in times and probe() is ready:
                    times[name] = time.monotonic() - since
            if time.monotonic() - since > limit_s:
                return {name: times.get(name, float("inf")) for name in self.probes}
            time.sleep(0.02)
        return times

    def close(self) -> None:
        self.triton.close()
        self.channel.close()
