"""Limits on every protocol: body sizes, deadlines, bounded queues, slow clients.

- A request body over ``http.max_body_bytes`` is refused by every REST
  protocol with 413 in its own error form, naming the limit and its key, from
  the Content-Length alone (the body is never sent here); a chunked body is
  cut at the limit. gRPC refuses messages over ``grpc.max_message_bytes``
  (RESOURCE_EXHAUSTED) and MIP frames over ``mip.max_frame_bytes`` (MEMORY).
- Deadlines (KServe's ``timeout`` parameter, gRPC deadlines) end a call with
  the protocol's deadline error at the deadline, not when the model is done.
- A model instance holds at most ``max_queue`` queued requests; the rest are
  refused at once as Overloaded: 429, RESOURCE_EXHAUSTED, GraphPipe code 16,
  MIP MEMORY, each message naming the model, the limit and its key.
- Slow clients (slowloris) on the HTTP, MIP and gRPC ports do not delay
  others, and a request that trickles in slowly is still served.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from graphpipe import convert
from tritonclient.utils import InferenceServerException

from appliance._generated import grps_pb2, grps_pb2_grpc
from appliance.protocols.mip.client import MipClient, MipReplyError, encode_request, tensor_item
from appliance.protocols.mip.codec import ErrorCode as MipCode
from tests.system.harness import Appliance, demo_models, running

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

LIMIT = 1 << 20
MAX_QUEUE = 2
SLOW_S = 0.3
CROWD = 16
HTTP_THREADS = 8
TIMEOUT_S = 10.0
READ_TIMEOUT_S = 3.0  # http.read_timeout_s: shorter than the default, for a quick test
IO_TIMEOUT_S = 3.0  # http.io_timeout_s, likewise
MODELS = [
    *demo_models("echo"),
    {"name": "sleepy", "class": "tests.models:Slow"},
    {
        "name": "slow",
        "class": "tests.system.faulty:Faulty",
        "max_batch_size": 1,
        "max_queue": MAX_QUEUE,
        "options": {"sleep_s": SLOW_S},
    },
]


@pytest.fixture(scope="module")
def served() -> Iterator[Appliance]:
    with running(
        MODELS,
        http={
            "workers": 1,
            "threads": HTTP_THREADS,
            "max_body_bytes": LIMIT,
            "read_timeout_s": READ_TIMEOUT_S,
        },
        grpc={"threads": CROWD, "max_message_bytes": LIMIT},
        mip={
            "listeners": [{"port": 0, "model": "echo"}, {"port": 0, "model": "slow"}],
            "max_frame_bytes": LIMIT,
        },
    ) as appliance:
        yield appliance


def mip_port(served: Appliance, model: str) -> int:
    return next(int(x["port"]) for x in served.state["mip_listeners"] if x["model"] == model)


# -- request size --------------------------------------------------------------------

REST_PATHS = {
    "kserve": "/v2/models/echo/infer",
    "grps": "/grps/v1/infer/predict",
    "graphpipe": "/graphpipe/echo",
    "umbridge": "/Evaluate",
}


def error_text(protocol: str, body: bytes) -> str:
    """The message of a 413 in each protocol's own error form."""
    if protocol == "kserve":
        return str(json.loads(body)["error"])
    if protocol == "grps":
        status = json.loads(body)["status"]
        assert status["code"] == 413
        assert status["status"] == "FAILURE"
        return str(status["msg"])
    if protocol == "umbridge":
        error = json.loads(body)["error"]
        assert error["type"] == "InvalidInput"
        return str(error["message"])
    return body.decode()  # GraphPipe: text/plain where no flatbuffer can carry it


@pytest.mark.parametrize("protocol", list(REST_PATHS))
def test_a_declared_body_over_the_limit_is_refused_unread(served: Appliance, protocol: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.ports["http"], timeout=TIMEOUT_S)
    try:
        conn.putrequest("POST", REST_PATHS[protocol])
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(LIMIT + 1))
        conn.endheaders()  # not one byte of the body: the answer comes anyway
        reply = conn.getresponse()
        assert reply.status == 413
        message = error_text(protocol, reply.read())
    finally:
        conn.close()
    assert f"of {LIMIT + 1} bytes exceeds the limit of {LIMIT} bytes" in message
    assert "(http.max_body_bytes)" in message


@pytest.mark.parametrize("protocol", list(REST_PATHS))
def test_a_chunked_body_over_the_limit_is_refused(served: Appliance, protocol: str) -> None:
    chunk = b" " * (64 << 10)
    chunks = iter([chunk] * (LIMIT // len(chunk) + 1))
    reply = requests.post(
        f"http://127.0.0.1:{served.ports['http']}{REST_PATHS[protocol]}",
        data=chunks,
        headers={"Content-Type": "application/json"},
        timeout=TIMEOUT_S,
    )
    assert reply.status_code == 413
    message = error_text(protocol, reply.content)
    assert f"exceeds the limit of {LIMIT} bytes (http.max_body_bytes)" in message


def test_grpc_and_mip_refuse_messages_over_their_limits(served: Appliance) -> None:
    big = np.zeros(LIMIT // 4 + 16, np.float32)
    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    try:
        tensor = grpcclient.InferInput("x", list(big.shape), "FP32")
        tensor.set_data_from_numpy(big)
        with pytest.raises(InferenceServerException) as raised:
            triton.infer("echo", [tensor])
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    finally:
        triton.close()
    with MipClient("127.0.0.1", mip_port(served, "echo"), timeout_s=TIMEOUT_S) as mip:
        with pytest.raises(MipReplyError) as refused:
            mip.infer([[tensor_item(big)]])
        assert refused.value.code == MipCode.MEMORY
        assert f"exceeds mip.max_frame_bytes ({LIMIT})" in refused.value.message
        mip.ping()  # the connection stays usable


# -- deadlines -------------------------------------------------------------------------


def timed(call: Callable[[], object]) -> tuple[BaseException, float]:
    started = time.monotonic()
    try:
        call()
    except Exception as ex:
        return ex, time.monotonic() - started
    raise AssertionError("the call did not fail")


def test_kserve_timeout_parameter_is_a_504_at_the_deadline(served: Appliance) -> None:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}")
    x = httpclient.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.ones(2, np.float32))
    try:
        error, took = timed(
            lambda: triton.infer("sleepy", [x], parameters={"sleep_s": 3.0}, timeout=500_000)
        )
    finally:
        triton.close()
    assert isinstance(error, InferenceServerException)
    assert error.status() == "504"
    assert "deadline" in str(error)
    assert took < 2.5


def test_grpc_deadlines_are_deadline_exceeded(served: Appliance) -> None:
    target = f"127.0.0.1:{served.ports['grpc']}"
    triton = grpcclient.InferenceServerClient(target)
    x = grpcclient.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.ones(2, np.float32))
    try:
        error, took = timed(
            lambda: triton.infer("sleepy", [x], parameters={"sleep_s": 3.0}, client_timeout=0.5)
        )
    finally:
        triton.close()
    assert isinstance(error, InferenceServerException)
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert took < 2.5
    with grpc.insecure_channel(target) as channel:
        stub = grps_pb2_grpc.GrpsServiceStub(channel)
        tensor = grps_pb2.GenericTensor(
            name="x", dtype=grps_pb2.DT_FLOAT32, shape=[2], flat_float32=[1, 1]
        )
        request = grps_pb2.GrpsMessage(
            model="sleepy", gtensors=grps_pb2.GenericTensorData(tensors=[tensor])
        )
        started = time.monotonic()
        try:
            reply = stub.Predict(request, timeout=0.5, metadata=[("sleep_s", "3")])
        except grpc.RpcError as ex:
            code = str(ex.code())
        else:
            # SPEC: grps.md — GRPS calls end OK with the failure in status;
            # the server gives up at the deadline, just before the client does.
            code = f"{reply.status.code} {reply.status.msg}"
        took = time.monotonic() - started
    assert code == "StatusCode.DEADLINE_EXCEEDED" or code.startswith("504 "), code
    assert took < 2.5


# -- bounded queues ----------------------------------------------------------------------


Outcome = tuple[str, str]  # ("ok" or the protocol's error code, message)


def kserve_rest(served: Appliance) -> Outcome:
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}")
    x = httpclient.InferInput("x", [1, 2], "FP64")
    x.set_data_from_numpy(np.ones((1, 2)))
    try:
        triton.infer("slow", [x])
    except InferenceServerException as ex:
        return str(ex.status()), str(ex.message())
    finally:
        triton.close()
    return "ok", ""


def kserve_grpc(served: Appliance) -> Outcome:
    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    x = grpcclient.InferInput("x", [1, 2], "FP64")
    x.set_data_from_numpy(np.ones((1, 2)))
    try:
        triton.infer("slow", [x], client_timeout=TIMEOUT_S)
    except InferenceServerException as ex:
        return str(ex.status()), str(ex.message())
    finally:
        triton.close()
    return "ok", ""


def grps_rest(served: Appliance) -> Outcome:
    tensor = {"name": "x", "dtype": "DT_FLOAT64", "shape": [1, 2], "flat_float64": [1, 1]}
    reply = requests.post(
        f"http://127.0.0.1:{served.ports['http']}/grps/v1/infer/predict",
        json={"model": "slow", "gtensors": {"tensors": [tensor]}},
        timeout=TIMEOUT_S,
    )
    status = reply.json()["status"]
    if reply.status_code == 200:
        return "ok", ""
    return f"{reply.status_code} {status['code']}", str(status["msg"])


def graphpipe(served: Appliance) -> Outcome:
    request = convert.serialize_infer_request(
        convert.InferReq(None, [np.ones((1, 2))], ["x"], ["y"])
    )
    reply = requests.post(
        f"http://127.0.0.1:{served.ports['http']}/graphpipe/slow", data=request, timeout=TIMEOUT_S
    )
    if reply.status_code != 200:
        return str(reply.status_code), reply.text
    _outputs, errors = convert.deserialize_infer_response(reply.content)
    if not errors:
        return "ok", ""
    message = errors[0]["message"]
    return str(errors[0]["code"]), message.decode() if isinstance(message, bytes) else message


def umbridge(served: Appliance) -> Outcome:
    reply = requests.post(
        f"http://127.0.0.1:{served.ports['http']}/Evaluate",
        json={"name": "slow", "input": [[1.0, 1.0]]},
        timeout=TIMEOUT_S,
    )
    if reply.status_code == 200:
        return "ok", ""
    error = reply.json()["error"]
    return f"{reply.status_code} {error['type']}", str(error["message"])


def mip(served: Appliance) -> Outcome:
    with MipClient("127.0.0.1", mip_port(served, "slow"), timeout_s=TIMEOUT_S) as client:
        try:
            client.infer([[tensor_item(np.ones(2))]])
        except MipReplyError as ex:
            return MipCode(ex.code).name, ex.message
    return "ok", ""


# Each protocol's client, and the code it must see for Overloaded.
CROWDS: dict[str, tuple[Callable[[Appliance], Outcome], str]] = {
    "kserve-rest": (kserve_rest, "429"),
    "kserve-grpc": (kserve_grpc, "StatusCode.RESOURCE_EXHAUSTED"),
    "grps-rest": (grps_rest, "429 429"),
    "graphpipe": (graphpipe, "16"),  # GraphPipeCode.OVERLOADED
    "umbridge": (umbridge, "429 Overloaded"),
    "mip": (mip, "MEMORY"),
}
HTTP_CROWDS = ("kserve-rest", "grps-rest", "graphpipe", "umbridge")


@pytest.mark.parametrize("protocol", list(CROWDS))
def test_a_full_queue_answers_overloaded(served: Appliance, protocol: str) -> None:
    call, overloaded = CROWDS[protocol]
    # HTTP calls wait for one of the frontend's threads; the rest arrive at once.
    crowd = HTTP_THREADS if protocol in HTTP_CROWDS else CROWD
    outcomes = run_together(lambda: call(served), crowd)
    refused = [(code, message) for code, message in outcomes if code != "ok"]
    assert refused, f"none of {crowd} calls was refused"
    assert len(outcomes) - len(refused) >= MAX_QUEUE
    for code, message in refused:
        assert code == overloaded, message
        assert "model slow is overloaded" in message
        assert f"the limit (models[slow].max_queue) is {MAX_QUEUE}" in message


def run_together(call: Callable[[], Outcome], count: int) -> list[Outcome]:
    """Run ``count`` calls at once; return their outcomes (or raise the first error)."""
    barrier = threading.Barrier(count)
    outcomes: list[Any] = [None] * count

    def one(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = call()
        except BaseException as ex:
            outcomes[index] = ex

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * 2)
    assert not any(thread.is_alive() for thread in threads), "a call hung"
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


# -- slow clients ------------------------------------------------------------------------

SLOW_BYTE_S = 0.3
WATCH_S = 3.0
ANSWER_S = 1.0


@contextlib.contextmanager
def trickling(port: int, data: bytes, count: int) -> Iterator[None]:
    """``count`` connections sending ``data`` one byte every SLOW_BYTE_S."""
    stop = threading.Event()
    socks = [socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) for _ in range(count)]

    def trickle(sock: socket.socket) -> None:
        for byte in data:
            if stop.wait(SLOW_BYTE_S):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return

    threads = [threading.Thread(target=trickle, args=(s,), daemon=True) for s in socks]
    for thread in threads:
        thread.start()
    try:
        time.sleep(SLOW_BYTE_S * 2)  # every slow connection has begun
        yield
    finally:
        stop.set()
        for sock in socks:
            sock.close()


def latencies(call: Callable[[], object], watch_s: float = WATCH_S) -> list[float]:
    """Call repeatedly for ``watch_s``; return each call's seconds (inf if it failed)."""
    taken = []
    until = time.monotonic() + watch_s
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            call()
            taken.append(time.monotonic() - started)
        except Exception:
            taken.append(float("inf"))
        time.sleep(0.1)
    return taken


def http_ready(served: Appliance) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.ports["http"], timeout=ANSWER_S * 2)
    try:
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


SLOW_HEADERS = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: slow\r\nContent-Length: 2\r\n\r\n{}"
SLOW_BODY = b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: slow\r\nContent-Length: 64\r\n\r\n" + (
    b" " * 64
)


@pytest.mark.parametrize("data", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
def test_slow_http_clients_do_not_starve_others(served: Appliance, data: bytes) -> None:
    with trickling(served.ports["http"], data, HTTP_THREADS + 2):
        taken = latencies(lambda: http_ready(served))
    assert max(taken) < ANSWER_S, taken


def test_http_request_that_never_completes_is_dropped_after_read_timeout(
    served: Appliance,
) -> None:
    with socket.create_connection(("127.0.0.1", served.ports["http"]), timeout=TIMEOUT_S) as sock:
        sock.sendall(SLOW_HEADERS[:20])  # a request line that never ends
        started = time.monotonic()
        assert sock.recv(1024) == b"", "the server answered a request it never got"
        waited = time.monotonic() - started
    # murder_pending runs about once a second; the connection goes at its next turn.
    assert READ_TIMEOUT_S - 0.5 < waited < READ_TIMEOUT_S + 3.0, waited
    http_ready(served)


def test_a_request_pipelined_behind_another_must_arrive_within_read_timeout(
    served: Appliance,
) -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
    infer = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    with socket.create_connection(("127.0.0.1", served.ports["http"]), timeout=TIMEOUT_S) as sock:
        # A whole request, then the start of one whose headers never end.
        sock.sendall(infer + SLOW_HEADERS[:20])
        [(status, _)] = read_responses(sock, 1)
        started = time.monotonic()
        assert status == 200
        assert sock.recv(1024) == b"", "the server answered a request it never got"
        waited = time.monotonic() - started
    # Not the keep-alive timeout (30 s): the read deadline, from the first answer on.
    assert waited < READ_TIMEOUT_S + 3.0, waited
    http_ready(served)


def test_an_http_client_that_stops_reading_its_reply_is_cut_off() -> None:
    # A reply far larger than the kernel's socket buffers: JSON text of 2 M floats.
    values = np.random.default_rng(0).random(1 << 21, dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [values.size],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    ).encode()
    body = header + values.tobytes()
    request = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
        + f"Inference-Header-Content-Length: {len(header)}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    with running(demo_models("echo"), http={"workers": 1, "io_timeout_s": IO_TIMEOUT_S}) as app:
        with socket.create_connection(("127.0.0.1", app.ports["http"]), timeout=TIMEOUT_S) as sock:
            sock.sendall(request + body)
            time.sleep(IO_TIMEOUT_S + 3.0)  # the reply waits, unread, past io_timeout_s
            received = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(1 << 20):
                    received += len(chunk)
        assert 0 < received < values.size * 8, "the reply waited for a client that did not read"
        http_ready(app)


def test_trickled_and_pipelined_http_requests_are_served(served: Appliance) -> None:
    request = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    ).encode()
    infer = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with socket.create_connection(("127.0.0.1", served.ports["http"]), timeout=TIMEOUT_S) as sock:
        for start in range(0, len(infer), 7):  # one request in small pieces
            sock.sendall(infer[start : start + 7])
            time.sleep(0.01)
        sock.sendall(request * 3)  # three more in one write
        replies = read_responses(sock, 4)
    assert [status for status, _ in replies] == [200] * 4
    assert json.loads(replies[0][1])["outputs"][0]["data"] == [1.0, 2.0]


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """Read ``count`` HTTP responses with Content-Length bodies from ``sock``."""
    replies = []
    reader = sock.makefile("rb")
    for _ in range(count):
        status = int(reader.readline().split()[1])
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        replies.append((status, reader.read(length)))
    return replies


def test_slow_mip_and_grpc_clients_do_not_starve_others(served: Appliance) -> None:
    frame = encode_request([[tensor_item(np.ones(2))]])
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    x = grpcclient.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.ones(2, np.float32))
    try:
        with (
            trickling(mip_port(served, "echo"), frame, 24),
            trickling(served.ports["grpc"], preface, 24),
            MipClient("127.0.0.1", mip_port(served, "echo"), timeout_s=TIMEOUT_S) as client,
        ):
            mip_taken = latencies(lambda: client.infer([[tensor_item(np.ones(2))]]))
            grpc_taken = latencies(lambda: triton.infer("echo", [x], client_timeout=ANSWER_S * 2))
    finally:
        triton.close()
    assert max(mip_taken) < ANSWER_S, mip_taken
    assert max(grpc_taken) < ANSWER_S, grpc_taken
