"""System shared memory, driven the same way against real Triton and against the appliance.

A tritonclient user's calls with Triton's system shared-memory extension:
register regions, infer with inputs read from them and outputs written into
them (at offsets too), read the status, and the mistakes a client makes (a
region that is not registered, a tensor past its region, a region past its
segment, a size that does not match the shape, a name registered twice).
Each call returns what the server answered and, for an inference, what the
output region holds afterwards. Both servers serve the benchmarks' Python
identity (bench/peers/python_backend/identity_py) and use the same segments,
one call at a time.

A region that is not registered (never, or no longer) is NOT_FOUND (404) on
both. Where the appliance answers otherwise (APART), the test holds both
sides to what they answer now, with the reason: Triton answers two of a
client's mistakes with INTERNAL (500). A region past the end of its segment
is left out: Triton answers it with INTERNAL when another region holds that
key, and with INVALID_ARGUMENT (as the appliance does) when none does.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from google.protobuf import json_format

from bench.servers import PeerServer
from tests.peers.conftest import triton_serving
from tests.peers.oracle import Call, assert_on_purpose, differences, urls_of
from tests.peers.oracle import both as oracle_both
from tests.system.harness import ROOT, Appliance, serving_repository

pytestmark = pytest.mark.peers

IDENTITY = ROOT / "bench" / "peers" / "python_backend" / "identity_py"
MODEL = "identity_py"
TAG = f"shmoracle{os.getpid()}"
SHAPE = [1, 256]  # FP32: 1 KiB a tensor, two tensors a segment
TENSOR_BYTES = 1024
SEGMENT_BYTES = 2 * TENSOR_BYTES
FIRST = np.arange(256, dtype=np.float32).reshape(SHAPE)
SECOND = -FIRST - 1


def key(name: str) -> str:
    return f"/{TAG}_{name}"


@pytest.fixture(scope="module")
def segments() -> Iterator[dict[str, Any]]:
    """The client's segments, made as a tritonclient user makes them; destroyed after."""
    made = {
        name: shm.create_shared_memory_region(f"{TAG}_{name}", key(name), SEGMENT_BYTES)
        for name in ("in", "out")
    }
    shm.set_shared_memory_region(made["in"], [FIRST])
    shm.set_shared_memory_region(made["in"], [SECOND], offset=TENSOR_BYTES)
    try:
        yield made
    finally:
        for handle in made.values():
            shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shm-oracle")
    shutil.copytree(IDENTITY, root / MODEL)
    return root


@pytest.fixture(scope="module")
def triton(repository: Path) -> Iterator[PeerServer]:
    with triton_serving(repository) as server:
        yield server


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    with serving_repository(repository) as started:
        yield started


def statuses(m: ModuleType, c: Any) -> list[tuple[str, str, int, int]]:
    """The registered system regions, as plain tuples, whichever transport."""
    if m is grpcclient:
        found = c.get_system_shared_memory_status(as_json=True).get("regions", {}).values()
    else:
        found = c.get_system_shared_memory_status()
    return sorted(
        (r["name"], r["key"], int(r.get("offset", 0)), int(r["byte_size"])) for r in found
    )


def calls_with(segments: dict[str, Any]) -> list[Call]:
    out = segments["out"]

    def infer(
        m: ModuleType,
        c: Any,
        source: tuple[str, int, int] | None,
        target: tuple[str, int, int] | None,
    ) -> dict[str, Any]:
        """Infer with the input in a region (or FIRST in the request) and the output in
        one (or in the response); what came back, and what the output region holds."""
        item = m.InferInput("INPUT0", SHAPE, "FP32")
        if source is None:
            item.set_data_from_numpy(FIRST)
        else:
            item.set_shared_memory(*source)
        wanted = m.InferRequestedOutput("OUTPUT0")
        if target is not None:
            wanted.set_shared_memory(*target)
        try:
            result = c.infer(MODEL, [item], outputs=[wanted])
            described = result.get_output("OUTPUT0")
            if m is grpcclient:
                described = json_format.MessageToDict(described)
            described = {k: v for k, v in described.items() if k != "data"}
            described["shape"] = [int(d) for d in described["shape"]]
            answered = None if target is not None else result.as_numpy("OUTPUT0").tolist()
            held = shm.get_contents_as_numpy(out, np.float32, [2, 256]).tolist()
        finally:
            shm.set_shared_memory_region(out, [np.zeros((2, 256), np.float32)])
        return {"output": described, "answered": answered, "region out": held}

    def register(m: ModuleType, c: Any) -> Any:
        c.register_system_shared_memory("in", key("in"), SEGMENT_BYTES)
        c.register_system_shared_memory("out", key("out"), SEGMENT_BYTES)
        return statuses(m, c)

    def at_offsets(m: ModuleType, c: Any) -> Any:
        return infer(m, c, ("in", TENSOR_BYTES, TENSOR_BYTES), ("out", TENSOR_BYTES, TENSOR_BYTES))

    def cleared(m: ModuleType, c: Any) -> Any:
        c.unregister_system_shared_memory()
        return statuses(m, c)

    def unregistered(m: ModuleType, c: Any) -> Any:
        c.register_system_shared_memory("gone", key("in"), SEGMENT_BYTES)
        c.unregister_system_shared_memory("gone")
        item = m.InferInput("INPUT0", SHAPE, "FP32")
        item.set_shared_memory("gone", TENSOR_BYTES)
        return c.infer(MODEL, [item])

    def unknown(m: ModuleType, c: Any) -> Any:
        item = m.InferInput("INPUT0", SHAPE, "FP32")
        item.set_shared_memory("ghost", TENSOR_BYTES)
        return c.infer(MODEL, [item])

    return [
        Call("register two regions", register),
        Call(
            "input and output in regions",
            lambda m, c: infer(m, c, ("in", TENSOR_BYTES, 0), ("out", TENSOR_BYTES, 0)),
        ),
        Call("input and output at offsets in their regions", at_offsets),
        Call(
            "input in a region, output in the response",
            lambda m, c: infer(m, c, ("in", TENSOR_BYTES, 0), None),
        ),
        Call(
            "input in the request, output in a region",
            lambda m, c: infer(m, c, None, ("out", TENSOR_BYTES, 0)),
        ),
        Call(
            "an input running past its region",
            lambda m, c: infer(m, c, ("in", TENSOR_BYTES, TENSOR_BYTES + 512), None),
        ),
        Call(
            "a region name registered twice",
            lambda m, c: c.register_system_shared_memory("in", key("in"), SEGMENT_BYTES),
            ("in",),
        ),
        Call("the status after everything is unregistered", cleared),
        # After it: Triton refuses a second name for a key another region holds.
        Call("an input naming a region never registered", unknown, ("'ghost'",)),
        Call("a region used after it was unregistered", unregistered, ("'gone'",)),
        Call(
            "the status of a region never registered",
            lambda m, c: c.get_system_shared_memory_status("ghost"),
            ("'ghost'",),
        ),
        Call(
            "an output naming a region never registered",
            lambda m, c: infer(m, c, None, ("ghost", TENSOR_BYTES, 0)),
            ("'ghost'",),
        ),
    ]


def apart_calls() -> list[Call]:
    def too_small(m: ModuleType, c: Any) -> Any:
        c.register_system_shared_memory("small_out", key("out"), SEGMENT_BYTES)
        try:
            item = m.InferInput("INPUT0", SHAPE, "FP32")
            item.set_data_from_numpy(FIRST)
            wanted = m.InferRequestedOutput("OUTPUT0")
            wanted.set_shared_memory("small_out", 512)
            return c.infer(MODEL, [item], outputs=[wanted])
        finally:
            c.unregister_system_shared_memory("small_out")

    return [
        Call("an output region smaller than the output", too_small, ("OUTPUT0", "512")),
        Call(
            "a key that names no segment",
            lambda m, c: c.register_system_shared_memory("nokey", key("never_made"), 64),
            ("never_made",),
        ),
    ]


CLIENTS_MISTAKE = (
    "400",
    "StatusCode.INVALID_ARGUMENT",
    "Triton answers this client's mistake as an internal error (500 / INTERNAL); the "
    "appliance as the bad request it is, naming the sizes or the key",
)
APART = {
    "an output region smaller than the output": CLIENTS_MISTAKE,
    "a key that names no segment": CLIENTS_MISTAKE,
}

# What Triton answers instead, (REST, gRPC).
TRITONS = {
    CLIENTS_MISTAKE: ("500", "StatusCode.INTERNAL"),
}


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_system_shared_memory_answers_as_triton_answers(
    triton: PeerServer, appliance: Appliance, segments: dict[str, Any], transport: str
) -> None:
    calls = calls_with(segments)
    theirs, ours = oracle_both(triton.urls, urls_of(appliance), transport, calls)
    parted = differences(theirs, ours, calls)
    assert not parted, "\n".join(parted)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_where_the_appliance_answers_otherwise_it_is_known(
    triton: PeerServer, appliance: Appliance, segments: dict[str, Any], transport: str
) -> None:
    calls = apart_calls()
    theirs, ours = oracle_both(triton.urls, urls_of(appliance), transport, calls)
    assert_on_purpose(theirs, ours, calls, APART, transport)
    index = 0 if transport == "http" else 1
    for call in calls:
        expected = TRITONS[APART[call.name]][index]
        assert theirs[call.name][1] == expected, theirs[call.name]
