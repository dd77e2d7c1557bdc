"""Requests built to hurt: what a client controls, each refused in the protocol's own form.

The cases issue 33's review found (the rest of that review, sizes in headers,
binary tensor lengths, length fields, deep JSON, is covered where each codec
is tested): parameters nested deeper than a descriptor carries, or holding an
integer past 64 bits, answered 500 on every protocol that forwards them; a
FIFO where UM-Bridge expects a shared-memory segment blocked the HTTP worker
for good; and a decompression bomb must be refused while it inflates. Each
must end in a client error, with every process of the tree still the same.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from appliance.protocols.graphpipe.errors import GraphPipeCode
from tests.system.harness import Appliance, demo_models, running
from tests.unit.test_graphpipe_encoder import decode_infer_response, encode_infer_request

# graphpipe's encoder calls EndVector(n), deprecated since flatbuffers 2.0.7.
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

DEEP = 600  # past orjson's 254 levels when encoding, within its 1024 when parsing
SIMPLE = [
    {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
    for i in range(2)
]
VECTORS = [list(range(16)), list(range(16))]
MiB = 1 << 20


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(demo_models("simple", "echo"), http={"max_body_bytes": 4 * MiB}) as started:
        before = processes(started)
        yield started
        assert processes(started) == before, "a frontend or worker was replaced"
        assert "Traceback" not in started.log()


@pytest.fixture(scope="module")
def base(appliance: Appliance) -> str:
    return f"http://127.0.0.1:{appliance.ports['http']}"


def processes(appliance: Appliance) -> list[tuple[str, int, int]]:
    return sorted((p["role"], p["pid"], p["restarts"]) for p in appliance.processes())


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def test_kserve_parameters_too_deep_or_too_large_are_400(base: str) -> None:
    url = f"{base}/v2/models/simple/infer"
    inputs = str(SIMPLE).replace("'", '"')
    for value in (nested(DEEP), nested(300)):
        body = f'{{"parameters": {{"x": {value}}}, "inputs": {inputs}}}'
        reply = requests.post(url, data=body, timeout=30)
        assert reply.status_code == 400, reply.text
        assert "parameters cannot be passed to the model" in reply.json()["error"]
    body = f'{{"parameters": {{"x": {nested(200)}}}, "inputs": {inputs}}}'
    assert requests.post(url, data=body, timeout=30).status_code == 200


def test_umbridge_config_too_deep_is_invalid_input(base: str) -> None:
    body = f'{{"name": "simple", "input": {VECTORS}, "config": {nested(DEEP)}}}'
    reply = requests.post(f"{base}/Evaluate", data=body, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "InvalidInput"
    assert "parameters cannot be passed to the model" in error["message"]


def test_graphpipe_config_too_deep_is_an_error_reply(base: str) -> None:
    arrays = [np.arange(16, dtype=np.int32).reshape(1, 16)] * 2
    body = encode_infer_request(arrays, config=nested(DEEP))
    reply = requests.post(f"{base}/graphpipe/simple", data=body, timeout=30)
    assert reply.status_code == 200, reply.text
    outputs, errors = decode_infer_response(reply.content)
    assert outputs == []
    assert errors[0][0] == GraphPipeCode.BAD_REQUEST
    assert "parameters cannot be passed to the model" in errors[0][1]


def test_grps_query_integers_past_64_bits_reach_the_model_as_text(base: str) -> None:
    for digits in ("9" * 30, "-" + "9" * 30, "18446744073709551616"):
        reply = requests.post(
            f"{base}/grps/v1/infer/predict?model=echo&x={digits}",
            json={"str_data": "hi"},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["str_data"] == "hi"


@pytest.mark.parametrize("name", ["gzip", "deflate"])
def test_a_decompression_bomb_is_refused_while_it_inflates(base: str, name: str) -> None:
    # 256 MiB of zeros in about 250 KB, against a 4 MiB body limit.
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if name == "gzip" else 15)
    zeros = bytes(MiB)
    bomb = b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()
    started = time.monotonic()
    reply = requests.post(
        f"{base}/v2/models/simple/infer",
        data=bomb,
        headers={"Content-Encoding": name},
        timeout=30,
    )
    assert reply.status_code == 413, reply.text
    assert "decompressed request body exceeds the limit of 4194304 bytes" in reply.text
    # Refused after 4 MiB of output, not after 256 MiB.
    assert time.monotonic() - started < 5.0


def test_a_fifo_for_a_umbridge_segment_is_refused_without_blocking(base: str) -> None:
    tid = f"fifo{os.getpid()}"
    fifo = Path(f"/dev/shm/umbridge_in_{tid}_0")
    other = Path(f"/dev/shm/umbridge_in_{tid}_1")
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo, 0o600)
    other.write_bytes(bytes(16 * 8))
    body = {
        "name": "simple",
        "tid": tid,
        "shmem_name": "/umbridge",
        "shmem_num_inputs": 2,
        "shmem_size_0": 16,
        "shmem_size_1": 16,
    }
    answers: list[requests.Response] = []
    try:
        # Opened for reading with no writer, a FIFO would block the frontend's loop.
        caller = threading.Thread(
            target=lambda: answers.append(
                requests.post(f"{base}/EvaluateShMem", json=body, timeout=30)
            )
        )
        caller.start()
        caller.join(10)
        assert answers, "the request hung on the FIFO"
        assert answers[0].status_code == 400
        assert "is not a shared-memory segment" in answers[0].json()["error"]["message"]
        plain = {"name": "simple", "input": VECTORS}
        assert requests.post(f"{base}/Evaluate", json=plain, timeout=10).status_code == 200
    finally:
        fifo.unlink(missing_ok=True)
        other.unlink(missing_ok=True)


def test_kserve_refuses_to_register_a_fifo(base: str) -> None:
    fifo = Path(f"/dev/shm/ksfifo{os.getpid()}")
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo, 0o600)
    try:
        reply = requests.post(
            f"{base}/v2/systemsharedmemory/region/f/register",
            json={"key": f"/{fifo.name}", "offset": 0, "byte_size": 8},
            timeout=10,
        )
        assert reply.status_code == 400
        assert "is not a shared-memory segment" in reply.json()["error"]
    finally:
        fifo.unlink(missing_ok=True)


def test_kserve_booleans_as_uint64_data_are_served(base: str) -> None:
    # numpy's range check of a bool against UINT64's maximum overflowed: a 500.
    body = {"inputs": [{"name": "x", "shape": [2], "datatype": "UINT64", "data": [True, False]}]}
    reply = requests.post(f"{base}/v2/models/echo/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [1, 0]
