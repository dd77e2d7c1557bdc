"""MIP on the wire: every error subtype, pipelining, partial frames, limits.

Raw sockets against an appliance with small limits. The ``Failing`` model
below is imported by its model worker.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest

from appliance.protocols.mip.client import MipClient, decode_item, encode_request, tensor_item
from appliance.protocols.mip.codec import ItemType
from tests.system.harness import Appliance, demo_models, running

PING = bytes([0, 1, 0, 0, 0, 0, 0, 0])
PONG = bytes([0, 1, 1, 0, 0, 0, 0, 0])
READ_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 3.0
MAX_CONNECTIONS = 6
MAX_FRAME_BYTES = 1 << 20
WAIT_S = 15.0


SERVED = ["echo", "simple", "identity", "failing", "slow"]


@pytest.fixture(scope="module")
def app() -> Iterator[Appliance]:
    models = demo_models("echo", "simple", "identity")
    models += [
        {"name": "failing", "class": "tests.models:Failing"},
        {"name": "slow", "class": "tests.models:Slow", "options": {"sleep_s": 0.3}},
    ]
    mip = {
        "listeners": [{"port": 0, "model": name} for name in SERVED],
        "max_frame_bytes": MAX_FRAME_BYTES,
        "read_timeout_s": READ_TIMEOUT_S,
        "idle_timeout_s": IDLE_TIMEOUT_S,
        "max_connections": MAX_CONNECTIONS,
    }
    with running(models, mip=mip, shm={"max_tensor_bytes": 256 * 1024}) as appliance:
        yield appliance
        log = appliance.log()
    # The failing model's worker logs its traceback; the MIP process logs none.
    assert not [line for line in log.splitlines() if " mip[" in line and "ERROR" in line], log


def port(app: Appliance, model: str) -> int:
    return next(int(x["port"]) for x in app.state["mip_listeners"] if x["model"] == model)


@contextlib.contextmanager
def connect(app: Appliance, model: str = "echo") -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", port(app, model)), timeout=WAIT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        yield sock


def read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> tuple[bytes, bytes]:
    header = read_exactly(sock, 8)
    return header, read_exactly(sock, struct.unpack("!L", header[4:])[0])


def error_code(sock: socket.socket) -> tuple[int, str]:
    header, payload = read_frame(sock)
    assert header[:2] == bytes([0, 0]), header
    return header[2], payload.decode()


def is_closed(sock: socket.socket) -> bool:
    """Wait (bounded) for the server to close; True if it did."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def frame(kind: int, subtype: int, payload: bytes, version: int = 0) -> bytes:
    return struct.pack("!4BL", version, kind, subtype, 0, len(payload)) + payload


def echo_request(value: int) -> bytes:
    return encode_request([[tensor_item(np.array([value], dtype=np.int64))]])


def echoed(sock: socket.socket) -> int:
    header, payload = read_frame(sock)
    assert header[:3] == bytes([0, 2, 1]), (header, payload)
    data = payload[4 + 8 :]
    return int(decode_item((ItemType.TENSOR, data))[0])


# -- the six error subtypes ------------------------------------------------------------


def test_bad_version_is_protocol_error_then_close(app: Appliance) -> None:
    with connect(app) as sock:
        sock.sendall(frame(1, 0, b"", version=1) + b"\xff" * 5000)
        code, message = error_code(sock)
        assert code == 0
        assert "version 1" in message
        assert is_closed(sock)


def test_a_garbage_peer_does_not_affect_others(app: Appliance) -> None:
    with connect(app) as good, connect(app) as bad:
        good.sendall(PING)
        assert read_exactly(good, 8) == PONG
        bad.sendall(np.random.default_rng(0).bytes(200_000).replace(b"\0", b"\1"))
        assert error_code(bad)[0] == 0
        assert is_closed(bad)
        good.sendall(echo_request(7) + PING)
        assert echoed(good) == 7
        assert read_exactly(good, 8) == PONG


def test_wrong_subtype_is_subtype_error_and_the_connection_stays(app: Appliance) -> None:
    with connect(app) as sock:
        sock.sendall(frame(2, 1, b"\x01\x00\x00\x01" + b"\0" * 8) + PING)
        assert error_code(sock)[0] == 1
        assert read_exactly(sock, 8) == PONG


@pytest.mark.parametrize("kind", [0, 3, 255])
def test_unknown_kind_is_method_error_and_the_connection_stays(app: Appliance, kind: int) -> None:
    with connect(app) as sock:
        sock.sendall(frame(kind, 0, b"12345") + PING)
        code, message = error_code(sock)
        assert code == 2
        assert f"kind {kind}" in message
        assert read_exactly(sock, 8) == PONG


def test_an_oversized_frame_is_memory_error_and_skipped(app: Appliance) -> None:
    with connect(app) as sock:
        size = 2 * MAX_FRAME_BYTES
        sock.sendall(struct.pack("!4BL", 0, 2, 0, 0, size))
        # Answered from the header alone, before the payload is sent.
        code, message = error_code(sock)
        assert code == 3
        assert f"{size} bytes exceeds mip.max_frame_bytes ({MAX_FRAME_BYTES})" in message
        sock.sendall(b"\0" * size + PING)
        assert read_exactly(sock, 8) == PONG


def test_a_tensor_over_the_core_limit_is_memory_error(app: Appliance) -> None:
    with MipClient("127.0.0.1", port(app, "identity")) as client:
        with pytest.raises(Exception, match="max_tensor_bytes") as caught:
            client.infer([[tensor_item(np.zeros(128 * 1024, dtype=np.float32))]])
        assert getattr(caught.value, "code", None) == 3
        client.ping()


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b"\x01\x00\x00\x01" + struct.pack("!2L", 9, 1) + b"x", "unknown type 9"),
        (b"\x01\x00\x00\x02" + struct.pack("!2L", 1, 1) + b"x", "ends inside item 1"),
        (b"\x01\x00\x00\x01" + struct.pack("!2L", 1, 1) + b"xyz", "2 bytes after"),
        (b"\x01\x00", "at least the 4-byte"),
    ],
)
def test_payloads_that_do_not_match_are_shape_errors(
    app: Appliance, payload: bytes, words: str
) -> None:
    with connect(app) as sock:
        sock.sendall(frame(2, 0, payload) + PING)
        code, message = error_code(sock)
        assert code == 4
        assert words in message
        assert read_exactly(sock, 8) == PONG


def test_items_that_do_not_fit_the_model_are_shape_errors(app: Appliance) -> None:
    with connect(app, "simple") as sock:
        sock.sendall(encode_request([[tensor_item(np.zeros(16, np.int32))]]))
        code, message = error_code(sock)
    assert code == 4
    assert "model simple has 2 inputs (INPUT0, INPUT1); the request has n-input 1" in message


def test_a_model_failure_is_internal_error(app: Appliance) -> None:
    with connect(app, "failing") as sock:
        sock.sendall(echo_request(1) + PING)
        code, message = error_code(sock)
        assert code == 5
        assert "this model always fails" in message
        assert read_exactly(sock, 8) == PONG


# -- framing ---------------------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_order(app: Appliance) -> None:
    stream = b""
    expected: list[object] = []
    for index in range(40):
        if index % 10 == 3:
            stream += frame(9, 0, b"")
            expected.append("method")
        elif index % 5 == 0:
            stream += PING
            expected.append("pong")
        else:
            stream += echo_request(index)
            expected.append(index)
    with connect(app) as sock:
        sock.sendall(stream)
        got: list[object] = []
        for want in expected:
            if want == "pong":
                got.append("pong" if read_exactly(sock, 8) == PONG else "?")
            elif want == "method":
                got.append("method" if error_code(sock)[0] == 2 else "?")
            else:
                got.append(echoed(sock))
    assert got == expected


def test_a_frame_sent_byte_by_byte(app: Appliance) -> None:
    with connect(app) as sock:
        for byte in echo_request(42) + PING:
            sock.sendall(bytes([byte]))
            time.sleep(0.002)
        assert echoed(sock) == 42
        assert read_exactly(sock, 8) == PONG


def test_a_peer_half_closing_after_its_request_still_gets_the_reply(app: Appliance) -> None:
    with connect(app) as sock:
        sock.sendall(echo_request(5))
        sock.shutdown(socket.SHUT_WR)
        assert echoed(sock) == 5
        assert is_closed(sock)


def test_peers_disconnecting_mid_frame_or_mid_request_harm_nothing(app: Appliance) -> None:
    request = echo_request(3)
    for cut in (3, 8, 12, len(request) - 1):
        with connect(app) as sock:
            sock.sendall(request[:cut])
    # slow's x is [-1]: a batch of scalars, answered after 0.3 s.
    scalars = encode_request([[tensor_item(np.float32(value))] for value in range(4)])
    with connect(app, "slow") as sock:
        sock.sendall(scalars)
    with connect(app, "slow") as sock:
        sock.sendall(scalars)
        outputs = [[(ItemType(t), d) for t, d in row] for row in _outputs(sock)]
        assert [decode_item(row[0]).tolist() for row in outputs] == [0.0, 1.0, 2.0, 3.0]
    with connect(app) as sock:
        sock.sendall(request)
        assert echoed(sock) == 3


def _outputs(sock: socket.socket) -> list[list[tuple[int, bytes]]]:
    header, payload = read_frame(sock)
    assert header[:3] == bytes([0, 2, 1]), (header, payload)
    n_output, batch = payload[1], struct.unpack("!H", payload[2:4])[0]
    offset, rows = 4, []
    for _element in range(batch):
        row = []
        for _output in range(n_output):
            kind, length = struct.unpack_from("!2L", payload, offset)
            row.append((kind, payload[offset + 8 : offset + 8 + length]))
            offset += 8 + length
        rows.append(row)
    return rows


# -- limits ---------------------------------------------------------------------------------


def test_a_peer_stalling_mid_frame_is_dropped(app: Appliance) -> None:
    with connect(app) as sock:
        sock.sendall(echo_request(1)[:10])
        assert is_closed(sock)
    assert "in the middle of a frame" in app.log()


def test_a_peer_that_does_not_read_its_replies_is_dropped(app: Appliance) -> None:
    # 200 KB tensors (under shm.max_tensor_bytes): 32 MB of replies in all,
    # more than the socket buffers hold.
    request = encode_request([[tensor_item(np.zeros(50_000, np.float32))]])
    stream = memoryview(request * 160)
    received = 0
    with connect(app) as sock, contextlib.suppress(ConnectionError):
        sock.settimeout(0.5)
        sent = 0
        deadline = time.monotonic() + WAIT_S
        # The server stops reading once its replies back up, then drops us.
        while sent < len(stream) and time.monotonic() < deadline:
            # send() with a timeout raises only when nothing could be sent.
            with contextlib.suppress(TimeoutError):
                sent += sock.send(stream[sent : sent + (1 << 20)])
        sock.settimeout(WAIT_S)
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
    assert received < len(stream)
    assert "not reading its replies" in app.log()


def test_an_idle_connection_is_closed(app: Appliance) -> None:
    with connect(app) as sock:
        sock.sendall(PING)
        assert read_exactly(sock, 8) == PONG
        assert is_closed(sock)


def test_connections_beyond_the_limit_are_refused(app: Appliance) -> None:
    with contextlib.ExitStack() as stack:
        for _index in range(MAX_CONNECTIONS):
            sock = stack.enter_context(connect(app))
            sock.sendall(PING)
            assert read_exactly(sock, 8) == PONG
        with connect(app) as extra:
            extra.sendall(PING)
            code, message = error_code(extra)
            assert code == 3
            assert f"mip.max_connections is {MAX_CONNECTIONS}" in message
            assert is_closed(extra)
    deadline = time.monotonic() + WAIT_S
    while True:
        with connect(app) as sock:
            sock.sendall(PING)
            if read_exactly(sock, 8) == PONG or time.monotonic() > deadline:
                break
    assert time.monotonic() <= deadline
