"""Clients that shrink, remove or replace their shared memory while requests use it.

A local client registers a segment, then truncates it, restores it, unlinks
and re-creates it while its requests name it (issue 33). Each copy from or
into the segment must then either succeed or end in the protocol's own
client error (400, INVALID_ARGUMENT, UM-Bridge's InvalidInput): never a
signal in a frontend process, never a 500. A second client on the same port
meanwhile does nothing wrong and must never notice.

The racing client writes its segments with os.pwrite, never through a
mapping: a mapping would kill the test process itself when its own racer
shrinks the file.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.system.harness import Appliance, demo_models, running

RACE_S = 4.0
MiB = 1 << 20
SHAPE = [1, MiB // 4]  # identity's FP32 input: 1 MiB
TAG = f"race{os.getpid()}"
DATA = np.arange(SHAPE[1], dtype=np.float32).reshape(SHAPE)
IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
REASONS = (
    "while it was read",
    "while it was written",
    "shrank to",
    "was replaced",
    "cannot be opened",
    "is registered",
    "holds",
)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    models = demo_models("identity", "simple")
    shm = {"request_ring_bytes": 16 * MiB, "response_ring_bytes": 16 * MiB}
    with running(models, shm=shm, http={"workers": 1, "threads": 4}) as started:
        yield started


@pytest.fixture
def segments() -> Iterator[Callable[[str, int], Path]]:
    """Create segments as a client does (a /dev/shm file); remove them afterwards."""
    made: list[Path] = []

    def make(name: str, size: int) -> Path:
        path = Path("/dev/shm", f"{TAG}_{name}")
        path.unlink(missing_ok=True)
        create(path, size)
        made.append(path)
        return path

    yield make
    for path in made:
        path.unlink(missing_ok=True)


def create(path: Path, size: int, data: bytes = b"") -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, size)
        if data:
            os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


@dataclass
class Racer:
    """Threads that shrink, restore, unlink and re-create client segments until stopped."""

    paths: list[Path]
    size: int
    data: bytes = b""
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    rounds: Counter[str] = field(default_factory=Counter)

    def truncate(self) -> None:
        while not self.stop.is_set():
            for path in self.paths:
                with contextlib.suppress(FileNotFoundError):
                    os.truncate(path, 0)
                    time.sleep(0.0005)
                    os.truncate(path, self.size)
                    self.rounds["truncated"] += 1
            time.sleep(0.0005)

    def replace(self) -> None:
        while not self.stop.wait(0.15):
            for path in self.paths:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                time.sleep(0.002)
                create(path, self.size, self.data)
                self.rounds["replaced"] += 1

    def __enter__(self) -> Racer:
        for work in (self.truncate, self.replace):
            thread = threading.Thread(target=work, daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
        for path in self.paths:
            create(path, self.size, self.data)


@dataclass
class Tally:
    """What the racing client and the bystander saw."""

    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    bystander_ok: int = 0
    bystander_failed: list[str] = field(default_factory=list)


def bystander(call: Callable[[], None], stop: threading.Event, tally: Tally) -> None:
    while not stop.is_set():
        try:
            call()
        except Exception as ex:
            tally.bystander_failed.append(f"{type(ex).__name__}: {ex}"[:300])
        else:
            tally.bystander_ok += 1
        time.sleep(0.01)


def race(
    appliance: Appliance,
    racer: Racer,
    request: Callable[[], None],
    judge: Callable[[Exception], str | None],
    other: Callable[[], None],
    reset: Callable[[], None] = lambda: None,
) -> Tally:
    """Send ``request`` in a loop while ``racer`` runs; ``other`` from a second client.

    ``judge`` names an error the client may get ("client error"), or None
    for anything else (a failure of the test). ``reset`` makes the client's
    setup whole again after the race (registers a replaced segment again).
    """
    before, logged = processes(appliance), len(appliance.log())
    tally = Tally()
    stop = threading.Event()
    side = threading.Thread(target=bystander, args=(other, stop, tally), daemon=True)
    side.start()
    deadline = time.monotonic() + RACE_S
    try:
        with racer:
            while time.monotonic() < deadline:
                try:
                    request()
                except Exception as ex:
                    kind = judge(ex)
                    if kind is None:
                        tally.unexpected.append(f"{type(ex).__name__}: {ex}"[:400])
                    else:
                        tally.outcomes[kind] += 1
                        tally.errors[reason(str(ex))] += 1
                else:
                    tally.outcomes["ok"] += 1
    finally:
        stop.set()
        side.join(30)
    # Still serving, in the same processes: no frontend or worker was replaced.
    reset()
    request()
    other()
    assert processes(appliance) == before
    log = appliance.log()[logged:]
    assert "SIGBUS" not in log
    assert "Traceback" not in log
    assert not tally.unexpected, tally.unexpected[:5]
    assert not tally.bystander_failed, tally.bystander_failed[:5]
    assert tally.bystander_ok > 0
    assert racer.rounds["truncated"] > 0
    assert racer.rounds["replaced"] > 0
    assert tally.outcomes["ok"] > 0
    assert tally.outcomes["client error"] > 0
    # Seen with -s: how the race went.
    print(f"{dict(tally.outcomes)}, errors {dict(tally.errors)}, bystander {tally.bystander_ok}")
    return tally


def reason(message: str) -> str:
    """What a client error says went wrong, without names and sizes."""
    for words in REASONS:
        if words in message:
            return words
    return message[:120]


def processes(appliance: Appliance) -> list[tuple[str, int, int]]:
    """(role, pid, restarts) of every process of the tree."""
    return sorted((p["role"], p["pid"], p["restarts"]) for p in appliance.processes())


# -- KServe system shared memory, REST and gRPC ------------------------------------


class Refused(Exception):
    """An HTTP answer other than 200."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text[:300]}")
        self.status, self.text = status, text


def checked(reply: requests.Response) -> requests.Response:
    if reply.status_code != 200:
        raise Refused(reply.status_code, reply.text)
    return reply


class RestKServe:
    """KServe REST over requests (tritonclient.http is gevent's: one thread only)."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/v2"
        self.session = requests.Session()

    def register(self, name: str, key: str, size: int) -> None:
        body = {"key": key, "offset": 0, "byte_size": size}
        checked(
            self.session.post(f"{self.url}/systemsharedmemory/region/{name}/register", json=body)
        )

    def unregister(self) -> None:
        checked(self.session.post(f"{self.url}/systemsharedmemory/unregister"))

    def identity(self) -> None:
        region = {"shared_memory_region": "in", "shared_memory_byte_size": MiB}
        out = {"shared_memory_region": "out", "shared_memory_byte_size": MiB}
        body = {
            "inputs": [
                {"name": "INPUT0", "shape": SHAPE, "datatype": "FP32", "parameters": region}
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": out}],
        }
        checked(self.session.post(f"{self.url}/models/identity/infer", json=body, timeout=30))

    def simple(self) -> None:
        tensors = [
            {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": IN0.tolist()}
            for i in range(2)
        ]
        reply = checked(
            self.session.post(
                f"{self.url}/models/simple/infer", json={"inputs": tensors}, timeout=30
            )
        )
        assert reply.json()["outputs"][0]["data"] == (IN0 * 2).reshape(-1).tolist()

    @staticmethod
    def message(ex: Exception) -> str | None:
        """The client error's message, None for any other failure."""
        # 404: a region not registered (the racer's replacement left it unregistered).
        if isinstance(ex, Refused) and ex.status in (400, 404):
            return str(ex.text)
        return None

    def close(self) -> None:
        self.session.close()


class GrpcKServe:
    """KServe gRPC through tritonclient (thread-safe)."""

    def __init__(self, port: int) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

    def register(self, name: str, key: str, size: int) -> None:
        self.client.register_system_shared_memory(name, key, size)

    def unregister(self) -> None:
        self.client.unregister_system_shared_memory()

    def identity(self) -> None:
        value = grpcclient.InferInput("INPUT0", SHAPE, "FP32")
        value.set_shared_memory("in", MiB)
        wanted = grpcclient.InferRequestedOutput("OUTPUT0")
        wanted.set_shared_memory("out", MiB)
        self.client.infer("identity", [value], outputs=[wanted])

    def simple(self) -> None:
        inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
        for tensor in inputs:
            tensor.set_data_from_numpy(IN0)
        result = self.client.infer("simple", inputs)
        assert np.array_equal(result.as_numpy("OUTPUT0"), IN0 * 2)

    @staticmethod
    def message(ex: Exception) -> str | None:
        if isinstance(ex, InferenceServerException) and ex.status() in (
            "StatusCode.INVALID_ARGUMENT",
            "StatusCode.NOT_FOUND",
        ):
            return ex.message() or ""
        return None

    def close(self) -> None:
        self.client.close()


def kserve_race(appliance: Appliance, speaker: Any, segs: Any) -> Tally:
    client, other = speaker(), speaker()
    paths = [segs("in", MiB), segs("out", MiB)]
    create(paths[0], MiB, DATA.tobytes())

    def register() -> None:
        client.unregister()
        client.register("in", f"/{paths[0].name}", MiB)
        client.register("out", f"/{paths[1].name}", MiB)

    def request() -> None:
        try:
            client.identity()
        except Exception as ex:
            # A replaced segment is registered again, as a client would.
            if "register" in (client.message(ex) or ""):
                with contextlib.suppress(Exception):
                    register()
            raise

    def judge(ex: Exception) -> str | None:
        message = client.message(ex)
        # The client error names the region whose segment went wrong.
        if message is not None and ("'in'" in message or "'out'" in message):
            return "client error"
        return None

    register()
    request()  # the flow works before the race
    try:
        racer = Racer(paths, MiB, DATA.tobytes())
        return race(appliance, racer, request, judge, other.simple, register)
    finally:
        client.unregister()
        client.close()
        other.close()


def test_kserve_rest_survives_a_client_racing_its_segments(
    appliance: Appliance, segments: Callable[[str, int], Path]
) -> None:
    kserve_race(appliance, lambda: RestKServe(appliance.ports["http"]), segments)


def test_kserve_grpc_survives_a_client_racing_its_segments(
    appliance: Appliance, segments: Callable[[str, int], Path]
) -> None:
    kserve_race(appliance, lambda: GrpcKServe(appliance.ports["grpc"]), segments)


# -- UM-Bridge's shared-memory endpoints ---------------------------------------------


def test_umbridge_shmem_survives_a_client_racing_its_segments(appliance: Appliance) -> None:
    url = f"http://127.0.0.1:{appliance.ports['http']}"
    tid = f"{TAG}r"
    names = [f"umbridge_in_{tid}_0", f"umbridge_in_{tid}_1"]
    names += [f"umbridge_out_{tid}_0", f"umbridge_out_{tid}_1"]
    paths = [Path("/dev/shm", name) for name in names]
    vector = np.arange(16, dtype=np.float64).tobytes()
    for path in paths:
        create(path, len(vector), vector)
    session, other = requests.Session(), requests.Session()
    body = {
        "name": "simple",
        "tid": tid,
        "shmem_name": "/umbridge",
        "shmem_num_inputs": 2,
        "shmem_size_0": 16,
        "shmem_size_1": 16,
        "config": {},
    }

    def request() -> None:
        reply = session.post(f"{url}/EvaluateShMem", json=body, timeout=30)
        if reply.status_code != 200:
            raise Refused(reply.status_code, reply.text)

    def judge(ex: Exception) -> str | None:
        if isinstance(ex, Refused) and ex.status == 400 and "InvalidInput" in ex.text:
            return "client error" if "shared-memory segment /umbridge" in ex.text else None
        return None

    def evaluate() -> None:
        plain = {"name": "simple", "input": [[1.0] * 16, [2.0] * 16], "config": {}}
        reply = other.post(f"{url}/Evaluate", json=plain, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["output"][0] == [3.0] * 16

    request()
    try:
        race(appliance, Racer(paths, len(vector), vector), request, judge, evaluate)
    finally:
        session.close()
        other.close()
        for path in paths:
            path.unlink(missing_ok=True)
