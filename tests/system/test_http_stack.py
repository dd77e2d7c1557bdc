"""The HTTP worker's own limits (frontends/http11.py), beyond test_limits.py's.

- A request head (request line and headers) still unfinished after
  ``HEAD_LIMIT_BYTES`` is answered 431 and its connection closed; one under
  it is served.
- A body over ``BODY_DEADLINE_BYTES`` may take longer than
  ``http.read_timeout_s`` while its bytes keep coming, and is dropped once
  they stop for ``http.io_timeout_s``.
- A keep-alive connection left idle is closed after ``http.keepalive_s``,
  shorter than ``http.read_timeout_s`` here, and served while used.
- What HTTP cannot parse (a byte outside ASCII in the path, a request line
  that is no HTTP, a Content-Length that is no count or said twice, a header
  name with a space) is answered 400 and its connection closed; the worker
  serves on. ``Expect: 100-continue`` is answered before the body is sent.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest

from appliance.frontends.http11 import BODY_DEADLINE_BYTES, HEAD_LIMIT_BYTES
from tests.system.harness import Appliance, demo_models, running
from tests.system.test_limits import http_ready, read_responses

READ_TIMEOUT_S = 2.0
IO_TIMEOUT_S = 2.0
KEEPALIVE_S = 1
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def served() -> Iterator[Appliance]:
    http = {
        "workers": 1,
        "read_timeout_s": READ_TIMEOUT_S,
        "io_timeout_s": IO_TIMEOUT_S,
        "keepalive_s": KEEPALIVE_S,
    }
    with running(demo_models("echo"), http=http) as appliance:
        yield appliance


def connect(served: Appliance) -> socket.socket:
    return socket.create_connection(("127.0.0.1", served.ports["http"]), timeout=TIMEOUT_S)


def ready_with_header(size: int) -> bytes:
    return b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * size + b"\r\n\r\n"


def test_a_request_head_over_the_limit_is_refused_and_closed(served: Appliance) -> None:
    with connect(served) as sock:
        sock.sendall(ready_with_header(HEAD_LIMIT_BYTES)[:-4])  # headers that go on
        [(status, body)] = read_responses(sock, 1)
        assert status == 431
        assert str(HEAD_LIMIT_BYTES).encode() in body
        assert sock.recv(1024) == b""
    http_ready(served)


def test_a_request_head_under_the_limit_is_served(served: Appliance) -> None:
    with connect(served) as sock:
        sock.sendall(ready_with_header(HEAD_LIMIT_BYTES - 1024) * 2)
        assert [status for status, _ in read_responses(sock, 2)] == [200, 200]


def large_infer() -> tuple[bytes, bytes]:
    """An echo request with a binary tensor over BODY_DEADLINE_BYTES: (head, body)."""
    values = np.arange(BODY_DEADLINE_BYTES // 2, dtype=np.float32)  # 2 MiB
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [values.size],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "x", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + values.tobytes()
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        + f"Inference-Header-Content-Length: {len(header)}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    return head, body


def test_a_large_body_may_take_longer_than_read_timeout_while_it_arrives(
    served: Appliance,
) -> None:
    head, body = large_infer()
    pieces = 8
    step = -(-len(body) // pieces)
    with connect(served) as sock:
        sock.sendall(head)
        began = time.monotonic()
        for start in range(0, len(body), step):
            time.sleep(READ_TIMEOUT_S / 4)  # each wait well within io_timeout_s
            sock.sendall(body[start : start + step])
        assert time.monotonic() - began > READ_TIMEOUT_S
        [(status, reply)] = read_responses(sock, 1)
    assert status == 200, reply[:200]
    assert len(reply) > BODY_DEADLINE_BYTES


def test_a_large_body_that_stops_arriving_is_dropped_after_io_timeout(served: Appliance) -> None:
    head, body = large_infer()
    with connect(served) as sock:
        sock.sendall(head + body[: len(body) // 4])
        started = time.monotonic()
        assert sock.recv(1024) == b"", "the server answered a request it never got"
        waited = time.monotonic() - started
    assert IO_TIMEOUT_S - 0.5 < waited < IO_TIMEOUT_S + 3.0, waited
    http_ready(served)


def test_an_idle_keep_alive_connection_is_closed_after_keepalive_s(served: Appliance) -> None:
    with connect(served) as sock:
        for _ in range(2):  # used again within keepalive_s: still open
            sock.sendall(ready_with_header(0))
            assert [status for status, _ in read_responses(sock, 1)] == [200]
            time.sleep(KEEPALIVE_S / 2)
    with connect(served) as sock:
        sock.sendall(ready_with_header(0))
        assert [status for status, _ in read_responses(sock, 1)] == [200]
        answered = time.monotonic()
        assert sock.recv(1024) == b""
        waited = time.monotonic() - answered
    # Its own limit, not the read deadline its opening set (READ_TIMEOUT_S).
    assert KEEPALIVE_S - 0.3 < waited < KEEPALIVE_S + 0.7, waited


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /v2/health/\xff HTTP/1.1\r\nHost: x\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n",
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
    ],
    ids=["non-ascii-path", "no-http", "bad-length", "two-lengths", "space-in-name"],
)
def test_what_http_cannot_parse_is_answered_400_and_closed(
    served: Appliance, request_bytes: bytes
) -> None:
    with connect(served) as sock:
        sock.sendall(request_bytes)
        [(status, _)] = read_responses(sock, 1)
        assert status == 400
        assert sock.recv(1024) == b""
    http_ready(served)


def test_expect_100_continue_is_answered_before_the_body(served: Appliance) -> None:
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    ).encode()
    head = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    with connect(served) as sock:
        sock.sendall(head)
        reader = sock.makefile("rb")
        assert reader.readline().split()[1] == b"100"
        assert reader.readline() == b"\r\n"
        sock.sendall(body)
        [(status, reply)] = read_responses(sock, 1)
    assert status == 200, reply
    assert json.loads(reply)["outputs"][0]["data"] == [1.0, 2.0]
