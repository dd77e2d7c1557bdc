"""Triton's system shared-memory extension, as the simple_*_shm example clients use it.

Two HTTP workers and two gRPC processes serve, so a region registered
through one process is used through another. Segments are made by
tritonclient.utils.shared_memory, as a user would; each test destroys its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from appliance.protocols.kserve.shm_sweeper import SWEEP_INTERVAL_S
from tests.system.harness import Appliance, demo_models, running

MODELS = [
    *demo_models("simple", "simple_string", "identity", "custom_identity_int32"),
    {"name": "broken", "class": "tests.models:BrokenLoad"},
    {
        "name": "identity_cached",
        "class": "appliance.demos.identity:Identity",
        "options": {"response_cache": True},
    },
    {
        "name": "identities",
        "platform": "ensemble",
        "inputs": [{"name": "IN", "dtype": "FP32", "shape": [-1, -1]}],
        "outputs": [{"name": "OUT", "dtype": "FP32", "shape": [-1, -1]}],
        "steps": [
            {"model": "identity", "input_map": {"INPUT0": "IN"}, "output_map": {"OUTPUT0": "a"}},
            {"model": "identity", "input_map": {"INPUT0": "a"}, "output_map": {"OUTPUT0": "OUT"}},
        ],
    },
]
IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
IN1 = np.ones((1, 16), dtype=np.int32)
# Keys unique to this run, so that concurrent runs never share a segment.
TAG = f"ks{os.getpid()}"

Client = Any  # grpcclient or httpclient InferenceServerClient
Module = Any  # the grpcclient or httpclient module


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(
        MODELS,
        http={"workers": 2},
        grpc={"workers": 2},
        server={"response_cache_bytes": 1 << 20},
    ) as started:
        yield started


def grpc_client(appliance: Appliance) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")


def http_client(appliance: Appliance) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")


@pytest.fixture(params=["grpc", "http"])
def both(request: pytest.FixtureRequest, appliance: Appliance) -> Iterator[tuple[Client, Module]]:
    if request.param == "grpc":
        client, module = grpc_client(appliance), grpcclient
    else:
        client, module = http_client(appliance), httpclient
    yield client, module
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions() -> Iterator[Callable[[str, int], Any]]:
    """Create client segments (named uniquely); destroy them afterwards."""
    made: list[Any] = []

    def make(name: str, byte_size: int) -> Any:
        handle = shm.create_shared_memory_region(name, f"/{TAG}_{name}", byte_size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def key(name: str) -> str:
    return f"/{TAG}_{name}"


def failure(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def simple_over_shm(client: Client, module: Module) -> tuple[Any, Any]:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("input_data", 64)
    inputs[1].set_shared_memory("input_data", 64, offset=64)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", 64)
    outputs[1].set_shared_memory("output_data", 64, offset=64)
    result = client.infer("simple", inputs, outputs=outputs)
    return result.get_output("OUTPUT0"), result.get_output("OUTPUT1")


def module_of(client: Client) -> Module:
    return grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient


def field(output: Any, name: str) -> Any:
    return output[name] if isinstance(output, dict) else getattr(output, name)


def test_the_example_shm_flow(both: tuple[Client, Module], regions: Any) -> None:
    client, module = both
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    out = regions("output_data", 128)
    inp = regions("input_data", 128)
    shm.set_shared_memory_region(inp, [IN0])
    shm.set_shared_memory_region(inp, [IN1], offset=64)
    client.register_system_shared_memory("output_data", key("output_data"), 128)
    client.register_system_shared_memory("input_data", key("input_data"), 128)
    sum_out, diff_out = simple_over_shm(client, module)
    assert field(sum_out, "datatype") == "INT32"
    assert list(field(sum_out, "shape")) == [1, 16]
    assert field(diff_out, "name") == "OUTPUT1"
    if module is httpclient:
        assert "data" not in sum_out
    total = shm.get_contents_as_numpy(out, np.int32, [1, 16])
    difference = shm.get_contents_as_numpy(out, np.int32, [1, 16], offset=64)
    assert np.array_equal(total, IN0 + IN1)
    assert np.array_equal(difference, IN0 - IN1)
    status = client.get_system_shared_memory_status()
    names = sorted(status.regions) if module is grpcclient else sorted(s["name"] for s in status)
    assert names == ["input_data", "output_data"]
    client.unregister_system_shared_memory()
    assert Path("/dev/shm", key("input_data")[1:]).exists()  # never unlinked by the server


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("identity", ("INPUT0", "OUTPUT0")),  # its output is a view of its input
        ("identity_cached", ("INPUT0", "OUTPUT0")),  # the second call is the cache's
        ("identities", ("IN", "OUT")),  # an ensemble's output
    ],
)
def test_outputs_of_any_kind_of_model_land_in_shared_memory(
    both: tuple[Client, Module], regions: Any, model: str, names: tuple[str, str]
) -> None:
    client, module = both
    size = 256 * 1024
    out = regions("out", 2 * size)
    client.register_system_shared_memory("out", key("out"), 2 * size)
    for call in range(3):
        data = np.full((64, 1024), float(call), np.float32)
        data[call, : call + 1] = -1.0
        sent = module.InferInput(names[0], list(data.shape), "FP32")
        sent.set_data_from_numpy(data)
        wanted = module.InferRequestedOutput(names[1])
        wanted.set_shared_memory("out", size, offset=size)
        result = client.infer(model, [sent], outputs=[wanted])
        assert list(field(result.get_output(names[1]), "shape")) == [64, 1024]
        written = shm.get_contents_as_numpy(out, np.float32, [2, 64, 1024])
        assert np.array_equal(written[1], data), f"call {call}"
        assert not written[0].any(), "nothing is written before the offset"
        if model == "identity_cached":
            # The same request again: the cache answers, and the output still lands.
            shm.set_shared_memory_region(out, [np.zeros((2, 64, 1024), np.float32)])
            client.infer(model, [sent], outputs=[wanted])
            assert np.array_equal(
                shm.get_contents_as_numpy(out, np.float32, [2, 64, 1024])[1], data
            )


def test_concurrent_batched_requests_each_land_in_their_own_region(
    appliance: Appliance, regions: Any
) -> None:
    """custom_identity_int32 batches up to 8 rows: each request's rows go to its own region."""
    count = 8
    handles = [regions(f"own{index}", 64) for index in range(count)]
    clients = [grpc_client(appliance) for _ in range(count // 2)] + [
        http_client(appliance) for _ in range(count // 2)
    ]
    for index in range(count):
        clients[0].register_system_shared_memory(f"own{index}", key(f"own{index}"), 64)

    def call(index: int) -> None:
        client = clients[index]
        module = module_of(client)
        for round_ in range(20):
            data = np.full((1, 16), index * 100 + round_, np.int32)
            sent = module.InferInput("INPUT0", [1, 16], "INT32")
            sent.set_data_from_numpy(data)
            wanted = module.InferRequestedOutput("OUTPUT0")
            wanted.set_shared_memory(f"own{index}", 64)
            client.infer("custom_identity_int32", [sent], outputs=[wanted])
            got = shm.get_contents_as_numpy(handles[index], np.int32, [1, 16])
            assert np.array_equal(got, data), f"client {index}, round {round_}"

    try:
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(call, range(count)))
    finally:
        clients[0].unregister_system_shared_memory()
        for client in clients:
            client.close()


def test_strings_in_shared_memory(both: tuple[Client, Module], regions: Any) -> None:
    client, module = both
    numbers = np.array([str(i).encode() for i in range(16)], dtype=object).reshape(1, 16)
    ones = np.array([b"1"] * 16, dtype=object).reshape(1, 16)
    packed0, packed1 = utils.serialize_byte_tensor(numbers), utils.serialize_byte_tensor(ones)
    size0, size1 = utils.serialized_byte_size(packed0), utils.serialized_byte_size(packed1)
    in0, in1 = regions("in0", size0), regions("in1", size1)
    out0 = regions("out0", 256)
    shm.set_shared_memory_region(in0, [packed0])
    shm.set_shared_memory_region(in1, [packed1])
    for name, handle_key, size in (
        ("in0", "in0", size0),
        ("in1", "in1", size1),
        ("out0", "out0", 256),
    ):
        client.register_system_shared_memory(name, key(handle_key), size)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "BYTES"),
        module.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_shared_memory("in0", size0)
    inputs[1].set_shared_memory("in1", size1)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out0", 256)
    result = client.infer("simple_string", inputs, outputs=outputs)
    total = shm.get_contents_as_numpy(out0, np.object_, [1, 16])
    assert [int(x) for x in total.reshape(-1)] == list(range(1, 17))
    assert [int(x) for x in result.as_numpy("OUTPUT1").reshape(-1)] == list(range(-1, 15))


def test_register_over_one_transport_infer_over_the_other(
    appliance: Appliance, regions: Any
) -> None:
    """Every HTTP worker and gRPC process sees a registration made anywhere."""
    out = regions("output_data", 128)
    inp = regions("input_data", 128)
    shm.set_shared_memory_region(inp, [IN0, IN1])
    registrar = http_client(appliance)
    registrar.register_system_shared_memory("output_data", key("output_data"), 128)
    registrar.register_system_shared_memory("input_data", key("input_data"), 128)
    try:
        for _ in range(4):  # new channels land on either gRPC process
            client = grpc_client(appliance)
            shm.set_shared_memory_region(out, [np.zeros((2, 16), np.int32)])
            simple_over_shm(client, grpcclient)
            client.close()
            assert np.array_equal(shm.get_contents_as_numpy(out, np.int32, [1, 16]), IN0 + IN1)
        for _ in range(4):
            client = http_client(appliance)
            simple_over_shm(client, httpclient)
            client.close()
    finally:
        registrar.unregister_system_shared_memory()
        registrar.close()
    client = grpc_client(appliance)
    error = failure(lambda: simple_over_shm(client, grpcclient))
    assert "no system shared memory region named" in error.message()
    client.close()


def serving_pids(appliance: Appliance) -> list[int]:
    """Every process's: the frontends copy and may map segments, and none other may
    keep one."""
    return [p["pid"] for p in appliance.processes() if p["pid"]]


def holds(pid: int, path: str) -> bool:
    """Whether a process maps ``path`` or has it open."""
    try:
        if path in Path(f"/proc/{pid}/maps").read_text():
            return True
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return False
    return path in links


def test_no_process_keeps_a_client_segment_once_it_is_unregistered(
    appliance: Appliance, regions: Any
) -> None:
    """A frontend may keep a registered segment mapped, for copies at memcpy's speed,
    but lets every one go once unregistered, so that the client can free it.

    Unregistering lands in one process; each other one lets go within the
    sweep interval (shm_sweeper.py). A mapped segment that the client shrinks
    must not kill the process with SIGBUS: test_client_memory.py races that.
    """
    out = regions("output_data", 128)
    inp = regions("input_data", 128)
    shm.set_shared_memory_region(inp, [IN0, IN1])
    clients = [grpc_client(appliance) for _ in range(3)] + [
        http_client(appliance) for _ in range(3)
    ]
    clients[0].register_system_shared_memory("output_data", key("output_data"), 128)
    clients[0].register_system_shared_memory("input_data", key("input_data"), 128)
    for client in clients:
        simple_over_shm(client, module_of(client))
    paths = [f"/dev/shm/{key(name)[1:]}" for name in ("input_data", "output_data")]
    clients[-1].unregister_system_shared_memory("input_data")
    assert os.path.exists(paths[0])
    assert shm.get_contents_as_numpy(out, np.int32, [1, 16]).tolist() == (IN0 + IN1).tolist()
    clients[0].unregister_system_shared_memory()
    deadline = time.monotonic() + SWEEP_INTERVAL_S + 5.0
    held = ["not yet looked"]
    while held and time.monotonic() < deadline:
        time.sleep(0.2)
        held = [(pid, p) for pid in serving_pids(appliance) for p in paths if holds(pid, p)]
    assert held == [], "processes still map or hold unregistered segments"
    for client in clients:
        client.close()


def test_shm_errors_are_clear_and_harmless(both: tuple[Client, Module], regions: Any) -> None:
    client, module = both
    invalid = "StatusCode.INVALID_ARGUMENT" if module is grpcclient else "400"
    regions("input_data", 128)
    regions("output_data", 128)
    regions("tiny", 16)
    error = failure(lambda: client.register_system_shared_memory("ghost", key("never_made"), 64))
    assert error.status() == invalid
    assert "unable to open shared memory key" in error.message()
    error = failure(lambda: client.register_system_shared_memory("big", key("tiny"), 64))
    assert "holds 16 bytes, fewer than offset 0 + byte_size 64" in error.message()
    error = failure(lambda: client.register_system_shared_memory("x", "/appliance-0-status", 8))
    assert "appliance's own segments" in error.message()
    error = failure(lambda: client.register_system_shared_memory("x", "/../etc/passwd", 8))
    assert "not a valid POSIX name" in error.message()
    client.register_system_shared_memory("input_data", key("input_data"), 128)
    error = failure(
        lambda: client.register_system_shared_memory("input_data", key("input_data"), 128)
    )
    assert error.status() == ("StatusCode.ALREADY_EXISTS" if module is grpcclient else "400")
    assert "already registered" in error.message()
    error = failure(lambda: simple_over_shm(client, module))
    assert error.status() == ("StatusCode.NOT_FOUND" if module is grpcclient else "404")
    assert "no system shared memory region named 'output_data'" in error.message()
    client.register_system_shared_memory("output_data", key("output_data"), 32)
    error = failure(lambda: simple_over_shm(client, module))
    assert "exceed the 32 bytes of region 'output_data'" in error.message()
    client.unregister_system_shared_memory("output_data")
    client.register_system_shared_memory("output_data", key("output_data"), 128)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("input_data", 64)
    inputs[1].set_shared_memory("input_data", 64, offset=64)
    small = module.InferRequestedOutput("OUTPUT0")
    small.set_shared_memory("output_data", 32)
    error = failure(lambda: client.infer("simple", inputs, outputs=[small]))
    assert "output OUTPUT0 needs 64 bytes but its shared_memory_byte_size is 32" in error.message()
    bad = module.InferInput("INPUT0", [1, 16], "INT32")
    bad.set_shared_memory("input_data", 60)
    error = failure(lambda: client.infer("simple", [bad, inputs[1]]))
    assert "60 bytes of data do not match shape [1, 16] of INT32" in error.message()
    simple_over_shm(client, module)  # still serving
    error = failure(lambda: client.get_system_shared_memory_status("ghost"))
    assert error.status() == ("StatusCode.NOT_FOUND" if module is grpcclient else "404")
    assert "no system shared memory region named 'ghost'" in error.message()


def test_a_segment_shrunk_after_registration_is_refused_not_fatal(
    both: tuple[Client, Module], regions: Any
) -> None:
    # Touching a mapping past the end of a shrunk file would SIGBUS the
    # frontend; the server copies with preadv/pwritev and answers with an error.
    client, module = both
    inp = regions("input_data", 128)
    regions("output_data", 128)
    shm.set_shared_memory_region(inp, [IN0])
    shm.set_shared_memory_region(inp, [IN1], offset=64)
    client.register_system_shared_memory("input_data", key("input_data"), 128)
    client.register_system_shared_memory("output_data", key("output_data"), 128)
    simple_over_shm(client, module)  # mapped now, in the process that served it
    for _ in range(4):  # reach every frontend process, whichever serves a call
        os.truncate(Path("/dev/shm", key("output_data")[1:]), 16)
        error = failure(lambda: simple_over_shm(client, module))
        assert "shrank to 16 bytes" in error.message()
    os.truncate(Path("/dev/shm", key("output_data")[1:]), 128)
    sum_out, _ = simple_over_shm(client, module)  # every process still serves
    assert list(field(sum_out, "shape")) == [1, 16]


def test_readiness_when_a_model_has_no_ready_instance(appliance: Appliance) -> None:
    for client in (grpc_client(appliance), http_client(appliance)):
        assert client.is_server_live()
        assert not client.is_server_ready()
        assert client.is_model_ready("simple")
        assert not client.is_model_ready("broken")
        x = module_of(client).InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.zeros(1, np.float32))
        error = failure(lambda client=client, x=x: client.infer("broken", [x]))
        assert error.status() in ("StatusCode.UNAVAILABLE", "503")
        client.close()
