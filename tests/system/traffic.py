"""Stock clients calling every protocol in loops, for fault injection and the soak.

Each :class:`Loop` is a thread that calls one protocol with that protocol's
own client (tritonclient over REST and gRPC, plain HTTP for GRPS as its
template client does, GraphPipe's and UM-Bridge's clients, our MIP client),
one request in flight at a time, paced, and records every call: when it
started and ended, and its error. A call that fails drops its client, so
the next one connects afresh, as a user's retry would. Every answer is
checked (y == 2x for a random x), so a mixed-up reply counts as a failure.

Calls are bounded by the clients' own timeouts where they have one
(CALL_TIMEOUT_S); GraphPipe's and UM-Bridge's clients have none, so a loop
also reports a call that has been running too long (:meth:`Loop.stuck_s`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import numpy.typing as npt

CALL_TIMEOUT_S = 10.0
# KServe's timeout parameter and the gRPC deadline, below CALL_TIMEOUT_S so
# the server's deadline error comes before the client gives up.
DEADLINE_S = 8.0
Array = npt.NDArray[np.float64]


class Background:
    """Threads that call in a loop until the ``with`` block ends.

    A subclass puts its threads in ``threads`` (their loops end once ``stop``
    is set); leaving the block stops and joins them, JOIN_S each at most.
    """

    JOIN_S = 30.0

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.JOIN_S)


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the appliance listens, and the model every loop calls."""

    http: int
    grpc: int
    mip: int
    model: str
    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Call:
    """One call a loop made: monotonic start and end, and its error ("" = ok)."""

    protocol: str
    started: float
    ended: float
    error: str = ""


class Caller:
    """One protocol's client, connected; ``__call__`` sends x and returns y."""

    protocol = ""

    def __init__(self, ep: Endpoints) -> None:
        self.endpoints = ep

    def __call__(self, x: Array) -> Array:
        raise NotImplementedError

    @staticmethod
    def example(rng: np.random.Generator) -> Array:
        """An input: one row of two whole numbers (exact in every wire format)."""
        return rng.integers(-1000, 1000, size=(1, 2)).astype(np.float64)

    @staticmethod
    def expected(x: Array) -> Array:
        return 2 * x

    def close(self) -> None:
        """Drop the connection, if the client holds one."""


class KserveRest(Caller):
    protocol = "kserve-rest"

    def __init__(self, ep: Endpoints) -> None:
        import tritonclient.http as httpclient

        self.lib = httpclient
        self.model = ep.model
        self.client = httpclient.InferenceServerClient(
            f"{ep.host}:{ep.http}",
            connection_timeout=CALL_TIMEOUT_S,
            network_timeout=CALL_TIMEOUT_S,
        )

    def __call__(self, x: Array) -> Array:
        tensor = self.lib.InferInput("x", list(x.shape), "FP64")
        tensor.set_data_from_numpy(x, binary_data=True)
        # tritonclient's timeout is KServe's timeout parameter, in microseconds.
        result = self.client.infer(self.model, [tensor], timeout=int(DEADLINE_S * 1e6))
        return np.asarray(result.as_numpy("y"))

    def close(self) -> None:
        self.client.close()


class KserveGrpc(Caller):
    protocol = "kserve-grpc"
    # None: tritonclient's own, under which every client of a process shares
    # one connection (gRPC's global subchannel pool).
    channel_args: list[tuple[str, Any]] | None = None

    def __init__(self, ep: Endpoints) -> None:
        import tritonclient.grpc as grpcclient

        self.lib = grpcclient
        self.model = ep.model
        self.client = grpcclient.InferenceServerClient(
            f"{ep.host}:{ep.grpc}", channel_args=self.channel_args
        )

    def __call__(self, x: Array) -> Array:
        tensor = self.lib.InferInput("x", list(x.shape), "FP64")
        tensor.set_data_from_numpy(x)
        result = self.client.infer(self.model, [tensor], client_timeout=DEADLINE_S)
        return np.asarray(result.as_numpy("y"))

    def close(self) -> None:
        self.client.close()


class GrpsRest(Caller):
    """GRPS over HTTP with requests, as GRPS's template client does."""

    protocol = "grps-rest"

    def __init__(self, ep: Endpoints) -> None:
        import requests

        self.url = f"http://{ep.host}:{ep.http}/grps/v1/infer/predict"
        self.model = ep.model
        self.session = requests.Session()

    def __call__(self, x: Array) -> Array:
        tensor = {"name": "x", "dtype": "DT_FLOAT64", "shape": list(x.shape)}
        tensor["flat_float64"] = x.ravel().tolist()
        body = {"model": self.model, "gtensors": {"tensors": [tensor]}}
        reply = self.session.post(self.url, json=body, timeout=CALL_TIMEOUT_S)
        doc = reply.json()
        if reply.status_code != 200:
            raise RuntimeError(f"GRPS {reply.status_code}: {doc.get('status')}")
        [out] = doc["gtensors"]["tensors"]
        return np.asarray(out["flat_float64"], np.float64).reshape(out["shape"])

    def close(self) -> None:
        self.session.close()


class GraphPipe(Caller):
    """graphpipe.remote: a new connection per call, and no timeout."""

    protocol = "graphpipe"

    def __init__(self, ep: Endpoints) -> None:
        from graphpipe import remote

        self.remote = remote
        self.url = f"http://{ep.host}:{ep.http}/graphpipe/{ep.model}"

    def __call__(self, x: Array) -> Array:
        [y] = self.remote.execute_multi(self.url, [x], ["x"], ["y"])
        return np.asarray(y)


class UmBridge(Caller):
    """umbridge.HTTPModel: a new connection per call, and no timeout."""

    protocol = "umbridge"

    def __init__(self, ep: Endpoints) -> None:
        import umbridge

        self.model = umbridge.HTTPModel(f"http://{ep.host}:{ep.http}", ep.model)

    def __call__(self, x: Array) -> Array:
        # UM-Bridge's input vector is one batch row, flattened.
        return np.asarray(self.model([x.ravel().tolist()]), np.float64)


class Mip(Caller):
    """Our MIP client: one persistent connection to the model's listener."""

    protocol = "mip"

    def __init__(self, ep: Endpoints) -> None:
        from appliance.protocols.mip import client

        self.lib = client
        self.client = client.MipClient(ep.host, ep.mip, timeout_s=CALL_TIMEOUT_S)

    def __call__(self, x: Array) -> Array:
        # A MIP batch element is one row; its item is the row without the batch dim.
        [[out]] = self.client.infer([[self.lib.tensor_item(x[0])]])
        return np.asarray(self.lib.decode_item(out))[np.newaxis]

    def close(self) -> None:
        self.client.close()


EVERY_PROTOCOL: tuple[type[Caller], ...] = (
    KserveRest,
    KserveGrpc,
    GrpsRest,
    GraphPipe,
    UmBridge,
    Mip,
)


class Loop(threading.Thread):
    """Call one protocol in a loop, at most one call every ``pace_s``."""

    def __init__(self, caller: type[Caller], ep: Endpoints, pace_s: float):
        self.protocol = caller.protocol
        super().__init__(name=f"traffic-{self.protocol}", daemon=True)
        self.make_caller = caller
        self.endpoints = ep
        self.pace_s = pace_s
        self.calls: list[Call] = []
        self.in_call_since: float | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        rng = np.random.default_rng(abs(hash(self.protocol)) % 2**32)
        caller: Caller | None = None
        while not self._stop_event.is_set():
            x = self.make_caller.example(rng)
            started = time.monotonic()
            self.in_call_since = started
            error = ""
            try:
                if caller is None:
                    caller = self.make_caller(self.endpoints)
                y = caller(x)
                want = self.make_caller.expected(x)
                if y.shape != want.shape or not np.array_equal(y, want):
                    error = (
                        f"WrongAnswer: {y.ravel()[:4].tolist()} for x = {x.ravel()[:4].tolist()}"
                    )
            except Exception as ex:
                error = describe(ex)
                _closed(caller)
                caller = None
            self.in_call_since = None
            ended = time.monotonic()
            self.calls.append(Call(self.protocol, started, ended, error))
            self._stop_event.wait(max(0.0, self.pace_s - (ended - started)))
        _closed(caller)

    def stop(self) -> None:
        self._stop_event.set()

    def stuck_s(self, now: float | None = None) -> float:
        """How long the call in progress has been running (0 if none)."""
        since = self.in_call_since
        return 0.0 if since is None else (now or time.monotonic()) - since


def _closed(caller: Caller | None) -> None:
    if caller is not None:
        with contextlib.suppress(Exception):
            caller.close()


def describe(ex: BaseException) -> str:
    """An error as a one-line string: its class and message, shortened."""
    text = " ".join(str(ex).split())
    return f"{type(ex).__name__}: {text[:300]}"


def start_loops(
    ep: Endpoints, pace_s: float, callers: Iterable[type[Caller]] = EVERY_PROTOCOL
) -> list[Loop]:
    loops = [Loop(caller, ep, pace_s) for caller in callers]
    for loop in loops:
        loop.start()
    return loops


def stop_loops(loops: list[Loop], timeout_s: float = CALL_TIMEOUT_S + 5.0) -> list[str]:
    """Stop every loop; return the protocols whose loop did not end in time."""
    for loop in loops:
        loop.stop()
    deadline = time.monotonic() + timeout_s
    for loop in loops:
        loop.join(max(0.0, deadline - time.monotonic()))
    return [loop.protocol for loop in loops if loop.is_alive()]


def calls_between(loops: Iterable[Loop], since: float, until: float) -> list[Call]:
    """Every call that overlapped [since, until]."""
    return [
        c for loop in loops for c in list(loop.calls) if c.ended >= since and c.started <= until
    ]


def all_succeeded_since(loops: Iterable[Loop], since: float) -> bool:
    """Every loop has made a call that started after ``since`` and succeeded."""
    for loop in loops:
        recent = [c for c in list(loop.calls) if c.started >= since]
        if not any(not c.error for c in recent):
            return False
    return True


def summarize(calls: Iterable[Call]) -> dict[str, Any]:
    """Per protocol: calls, failures, latency p50/max in ms."""
    by_protocol: dict[str, list[Call]] = {}
    for call in calls:
        by_protocol.setdefault(call.protocol, []).append(call)
    summary: dict[str, Any] = {}
    for protocol, group in sorted(by_protocol.items()):
        latencies = sorted((c.ended - c.started) * 1000 for c in group)
        summary[protocol] = {
            "calls": len(group),
            "failed": sum(1 for c in group if c.error),
            "p50_ms": round(latencies[len(latencies) // 2], 2),
            "max_ms": round(latencies[-1], 2),
        }
    return summary
