"""UM-Bridge error cases over raw HTTP and raw shared memory.

Every failure must come back as exactly ``{"error": {"type", "message"}}``
with the spec's status, checked in the spec's order: model name, support
flag, then the request's fields; never a traceback, whatever the body.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.system.harness import Appliance, demo_models, running

TIMEOUT_S = 10
MODELS = "tests.umbridge_models"
ENDPOINTS = ["Evaluate", "Gradient", "ApplyJacobian", "ApplyHessian"]
ALL_POSTS = [
    "ModelInfo",
    "InputSizes",
    "OutputSizes",
    "TestShMem",
    *(f"{endpoint}{suffix}" for endpoint in ENDPOINTS for suffix in ("", "ShMem")),
]
ROSENBROCK = {"name": "rosenbrock", "input": [[1.0, 2.0]]}


@pytest.fixture(scope="module")
def served() -> Iterator[Appliance]:
    models = [
        *demo_models("simple", "forward", "rosenbrock", "echo"),
        {"name": "scaled", "class": f"{MODELS}:Scaled"},
        {"name": "faulty", "class": f"{MODELS}:Faulty"},
    ]
    with running(models, http={"workers": 1}) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def url(served: Appliance) -> str:
    return f"http://127.0.0.1:{served.ports['http']}"


def post(url: str, endpoint: str, body: Any = None, raw: bytes | None = None) -> requests.Response:
    data = raw if raw is not None else None if body is None else json.dumps(body)
    return requests.post(f"{url}/{endpoint}", data=data, timeout=TIMEOUT_S)


def error_of(reply: requests.Response, status: int, kind: str) -> str:
    assert reply.status_code == status, reply.text
    assert reply.headers["Content-Type"] == "application/json"
    body = reply.json()
    assert list(body) == ["error"]
    assert sorted(body["error"]) == ["message", "type"]
    assert body["error"]["type"] == kind, body
    message = body["error"]["message"]
    assert isinstance(message, str)
    assert "Traceback" not in message
    return message


GARBAGE = [
    pytest.param(b"garbage", id="not-json"),
    pytest.param(b"[1, 2]", id="array"),
    pytest.param(b"null", id="null"),
    pytest.param(b'"name"', id="string"),
    pytest.param(b"\xff\xfe\x00", id="not-utf8"),
    pytest.param(b"[" * 5000 + b"]" * 5000, id="deep"),
    pytest.param(b'{"name": "forward", "input": [[1e999]]}', id="infinity"),
    pytest.param(b'{"name": "forward", "input": [[NaN]]}', id="nan"),
]


@pytest.mark.parametrize("raw", GARBAGE)
@pytest.mark.parametrize("endpoint", ALL_POSTS)
def test_garbage_bodies_get_invalid_input(url: str, endpoint: str, raw: bytes) -> None:
    message = error_of(post(url, endpoint, raw=raw), 400, "InvalidInput")
    assert "request body" in message


@pytest.mark.parametrize("endpoint", ALL_POSTS)
def test_the_model_name_is_checked_first(url: str, endpoint: str) -> None:
    body = {"name": "wrong_model_name", "input": "x", "outWrt": "y", "shmem_name": 5}
    message = error_of(post(url, endpoint, body), 400, "ModelNotFound")
    assert "wrong_model_name" in message
    assert "rosenbrock" in message  # the models one can use instead
    error_of(post(url, endpoint, {"name": 5}), 400, "ModelNotFound")


@pytest.mark.parametrize("endpoint", [e for e in ALL_POSTS if e != "TestShMem"])
def test_models_not_served_over_umbridge_are_not_found(url: str, endpoint: str) -> None:
    message = error_of(post(url, endpoint, {"name": "echo"}), 400, "ModelNotFound")
    assert message == "Model echo is not served over UM-Bridge: model echo takes generic " + (
        "(undeclared) tensors."
    )


@pytest.mark.parametrize("suffix", ["", "ShMem"])
@pytest.mark.parametrize("endpoint", ["Gradient", "ApplyJacobian", "ApplyHessian"])
def test_the_support_flag_is_checked_before_any_other_field(
    url: str, endpoint: str, suffix: str
) -> None:
    body = {"name": "simple", "input": "x", "outWrt": "y", "config": 3}
    message = error_of(post(url, endpoint + suffix, body), 400, "UnsupportedFeature")
    assert "simple" in message
    assert endpoint in message
    only_forward = {"ApplyJacobian", "ApplyHessian"}
    if endpoint in only_forward:
        error_of(post(url, endpoint + suffix, {"name": "forward"}), 400, "UnsupportedFeature")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input": [[1.0, 2.0], [3.0]]}, "takes 1 input vector(s) of sizes [2], got 2"),
        ({"input": []}, "got 0"),
        ({"input": [[1.0]]}, "Expected 2 but got 1"),
        ({"input": [[1.0, 2.0, 3.0]]}, "Expected 2 but got 3"),
        ({"input": {"x": 1}}, "'input' must be an array"),
        ({"input": None}, "'input' must be an array"),
        ({"input": [1.0]}, "must be an array of numbers, got a number"),
        ({"input": [[1.0, "2"]]}, 'non-number: "2"'),
        ({"input": [[1.0, True]]}, "non-number: true"),
        ({"input": [[1.0, None]]}, "non-number: null"),
        ({"input": [[1.0, [2.0]]]}, "non-number: [2.0]"),
        ({"input": [[1.0, {}]]}, "non-number: {}"),
        ({"config": [1]}, "'config' must be a JSON object"),
        ({"config": "scale=2"}, "'config' must be a JSON object"),
    ],
)
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_bad_input_vectors_and_config(
    url: str, endpoint: str, body: dict[str, Any], needle: str
) -> None:
    request = {**ROSENBROCK, "outWrt": 0, "inWrt": 0, "inWrt1": 0, "inWrt2": 0}
    request |= {"sens": [1.0], "vec": [1.0, 0.0]} | body
    assert needle in error_of(post(url, endpoint, request), 400, "InvalidInput")


@pytest.mark.parametrize(
    ("endpoint", "fields", "needle"),
    [
        ("Gradient", {"inWrt": 0, "sens": [1.0]}, "'outWrt' must be the integer index"),
        ("Gradient", {"outWrt": 1, "inWrt": 0, "sens": [1.0]}, "Invalid outWrt index"),
        ("Gradient", {"outWrt": -1, "inWrt": 0, "sens": [1.0]}, "Invalid outWrt index"),
        ("Gradient", {"outWrt": 0, "inWrt": 1, "sens": [1.0]}, "Invalid inWrt index"),
        ("Gradient", {"outWrt": 0.0, "inWrt": 0, "sens": [1.0]}, "got 0.0"),
        ("Gradient", {"outWrt": False, "inWrt": 0, "sens": [1.0]}, "got false"),
        ("Gradient", {"outWrt": 0, "inWrt": "0", "sens": [1.0]}, 'got "0"'),
        ("Gradient", {"outWrt": 0, "inWrt": 0}, "sens (output 0) must be an array"),
        ("Gradient", {"outWrt": 0, "inWrt": 0, "sens": [1.0, 2.0]}, "Expected 1 but got 2"),
        ("Gradient", {"outWrt": 0, "inWrt": 0, "sens": ["a"]}, "non-number"),
        ("ApplyJacobian", {"outWrt": 0, "inWrt": 0, "vec": [1.0]}, "Expected 2 but got 1"),
        ("ApplyJacobian", {"outWrt": 0, "inWrt": 0, "vec": 1.0}, "vec (input 0) must be"),
        ("ApplyJacobian", {"outWrt": 0, "inWrt1": 0, "vec": [1.0, 2.0]}, "'inWrt' must be"),
        ("ApplyHessian", {"outWrt": 0, "inWrt": 0, "sens": [1.0], "vec": [1.0, 2.0]}, "inWrt1"),
        ("ApplyHessian", {"outWrt": 0, "inWrt1": 0, "inWrt2": 1}, "Invalid inWrt2 index"),
        (
            "ApplyHessian",
            {"outWrt": 0, "inWrt1": 0, "inWrt2": 0, "sens": [], "vec": [1.0, 2.0]},
            "Expected 1 but got 0",
        ),
        (
            "ApplyHessian",
            {"outWrt": 0, "inWrt1": 0, "inWrt2": 0, "sens": [1.0], "vec": [1.0]},
            "Expected 2 but got 1",
        ),
    ],
)
def test_bad_derivative_fields(
    url: str, endpoint: str, fields: dict[str, Any], needle: str
) -> None:
    assert needle in error_of(post(url, endpoint, ROSENBROCK | fields), 400, "InvalidInput")


def test_hessian_vec_lives_in_the_space_of_in_wrt2(url: str) -> None:
    point = {"name": "scaled", "input": [[1.0, 2.0], [3.0, 4.0, 5.0]], "outWrt": 0}
    hessian = point | {"inWrt1": 0, "inWrt2": 1, "sens": [1.0, 1.0]}
    reply = post(url, "ApplyHessian", hessian | {"vec": [1.0, 1.0, 1.0]})
    assert reply.json() == {"output": [0.0, 0.0]}
    message = error_of(
        post(url, "ApplyHessian", hessian | {"vec": [1.0, 1.0]}), 400, "InvalidInput"
    )
    assert "vec (input 1) has invalid length! Expected 3 but got 2." in message


def test_wrong_derivative_length_from_the_model_is_invalid_output(url: str) -> None:
    body = {"name": "faulty", "input": [[1.0, 2.0]], "outWrt": 0, "inWrt": 0, "sens": [1.0, 1.0]}
    message = error_of(post(url, "Gradient", body), 500, "InvalidOutput")
    assert message == (
        "Gradient output of model faulty has invalid length! Model declared 2 but returned 5."
    )


def test_an_oversized_body_is_refused_without_reading_it(served: Appliance) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.ports["http"], timeout=TIMEOUT_S)
    try:
        conn.putrequest("POST", "/Evaluate")
        conn.putheader("Content-Length", str(10 << 30))
        conn.endheaders(b'{"name": "forward"')
        reply = conn.getresponse()
        assert reply.status == 413
        error = json.loads(reply.read())["error"]
        assert error["type"] == "InvalidInput"
        assert "exceeds the limit of 67108864 bytes (http.max_body_bytes)" in error["message"]
        assert "use_shmem=True" in error["message"]
    finally:
        conn.close()


def test_chunked_bodies_are_read(url: str) -> None:
    chunks = iter([b'{"name": "forward", ', b'"input": [[21.0]]}'])
    reply = requests.post(f"{url}/Evaluate", data=chunks, timeout=TIMEOUT_S)
    assert reply.json() == {"output": [[42.0]]}


def test_a_truncated_body_does_not_hang_or_crash_the_server(served: Appliance, url: str) -> None:
    with socket.create_connection(("127.0.0.1", served.ports["http"]), timeout=TIMEOUT_S) as conn:
        conn.sendall(b"POST /Evaluate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    assert post(url, "Evaluate", {"name": "forward", "input": [[1.0]]}).json() == {
        "output": [[2.0]]
    }


def test_replies_carry_exactly_the_spec_keys(url: str) -> None:
    assert list(requests.get(f"{url}/Info", timeout=TIMEOUT_S).json()) == [
        "protocolVersion",
        "models",
    ]
    assert list(post(url, "Evaluate", ROSENBROCK).json()) == ["output"]
    body = ROSENBROCK | {"outWrt": 0, "inWrt": 0, "sens": [1.0]}
    assert list(post(url, "Gradient", body).json()) == ["output"]


# -- the shared-memory side channel, driven by hand ------------------------------


class Segments:
    """Client-owned segments in /dev/shm, created like umbridge's client does."""

    def __init__(self) -> None:
        self.tid = uuid.uuid4().hex[:12]
        self.paths: list[Path] = []

    def create(self, name: str, values: list[float] | int) -> Path:
        path = Path("/dev/shm") / name
        if isinstance(values, list):
            data: np.ndarray | None = np.asarray(values, dtype=np.float64)
            size = len(values) * 8
        else:
            data, size = None, values
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            if data is not None:
                os.pwrite(fd, data.tobytes(), 0)
        finally:
            os.close(fd)
        self.paths.append(path)
        return path

    def read(self, path: Path) -> list[float]:
        return list(np.frombuffer(path.read_bytes(), dtype=np.float64))

    def cleanup(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


@pytest.fixture
def segments() -> Iterator[Segments]:
    made = Segments()
    try:
        yield made
    finally:
        made.cleanup()


def shm_request(segments: Segments, **extra: Any) -> dict[str, Any]:
    return {
        "name": "rosenbrock",
        "tid": segments.tid,
        "shmem_name": "/umbridge",
        "shmem_num_inputs": 1,
        "shmem_size_0": 2,
        **extra,
    }


def test_shmem_evaluate_writes_the_output_and_never_unlinks(url: str, segments: Segments) -> None:
    tid = segments.tid
    inp = segments.create(f"umbridge_in_{tid}_0", [1.0, 2.0])
    out = segments.create(f"umbridge_out_{tid}_0", 16)  # larger than Evaluate needs
    reply = post(url, "EvaluateShMem", shm_request(segments))
    assert (reply.status_code, reply.json()) == (200, {})
    assert segments.read(out) == [100.0, 0.0]
    body = shm_request(segments, outWrt=0, inWrt=0, sens=[1.0])
    assert post(url, "GradientShMem", body).json() == {}
    assert segments.read(out) == [-400.0, 200.0]
    assert inp.exists()
    assert out.exists()


def test_shmem_probe(url: str, segments: Segments) -> None:
    segments.create(f"umbridge_test_shmem_in_{segments.tid}", [12345.0])
    out = segments.create(f"umbridge_test_shmem_out_{segments.tid}", 8)
    reply = post(url, "TestShMem", {"name": "forward", "tid": segments.tid})
    assert reply.json() == {"value": [12345.0]}
    assert segments.read(out) == [12345.0]
    missing = post(url, "TestShMem", {"name": "forward", "tid": "nosuchthread"})
    assert (missing.status_code, missing.json()) == (200, {})
    assert post(url, "TestShMem", {"name": "forward", "tid": "../x"}).json() == {}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"shmem_name": "/appliance"}, "'shmem_name' must be"),
        ({"shmem_name": "/umbridge/../x"}, "'shmem_name' must be"),
        ({"shmem_name": None}, "'shmem_name' must be"),
        ({"tid": "../../etc"}, "'tid' must be"),
        ({"tid": None}, "'tid' must be"),
        ({"shmem_num_inputs": 2}, "got 2"),
        ({"shmem_num_inputs": "1"}, "'shmem_num_inputs' must be an integer"),
        ({"shmem_size_0": 3}, "Expected 2 but got 3"),
        ({"shmem_size_0": -1}, "'shmem_size_0' must be a count"),
    ],
)
def test_shmem_bad_fields(
    url: str, segments: Segments, change: dict[str, Any], needle: str
) -> None:
    segments.create(f"umbridge_in_{segments.tid}_0", [1.0, 2.0])
    segments.create(f"umbridge_out_{segments.tid}_0", 8)
    body = shm_request(segments) | change
    assert needle in error_of(post(url, "EvaluateShMem", body), 400, "InvalidInput")


def test_shmem_missing_and_short_segments(url: str, segments: Segments) -> None:
    message = error_of(post(url, "EvaluateShMem", shm_request(segments)), 400, "InvalidInput")
    assert f"/umbridge_in_{segments.tid}_0 cannot be opened" in message
    segments.create(f"umbridge_in_{segments.tid}_0", [1.0])  # 8 bytes for 2 values
    message = error_of(post(url, "EvaluateShMem", shm_request(segments)), 400, "InvalidInput")
    assert "holds 8 bytes, fewer than the 16 bytes" in message
    Path(f"/dev/shm/umbridge_in_{segments.tid}_0").unlink()
    segments.create(f"umbridge_in_{segments.tid}_0", [1.0, 2.0])
    segments.create(f"umbridge_out_{segments.tid}_0", 4)
    message = error_of(post(url, "EvaluateShMem", shm_request(segments)), 400, "InvalidInput")
    assert f"/umbridge_out_{segments.tid}_0 holds 4 bytes" in message


def test_shmem_follows_no_symlink(url: str, segments: Segments) -> None:
    target = segments.create(f"umbridge_target_{segments.tid}", [7.0, 7.0])
    link = Path(f"/dev/shm/umbridge_in_{segments.tid}_0")
    link.symlink_to(target)
    segments.paths.append(link)
    message = error_of(post(url, "EvaluateShMem", shm_request(segments)), 400, "InvalidInput")
    assert "cannot be opened" in message


def test_no_request_above_left_a_traceback_in_the_log(served: Appliance) -> None:
    # Runs last in this module: every bad request was answered, none crashed a responder.
    assert "UM-Bridge request failed" not in served.log()
    assert "Traceback" not in served.log()
