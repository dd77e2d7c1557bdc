"""TLS, bearer tokens and listening addresses, against one real appliance.

The appliance runs with a self-signed certificate made here (openssl),
a tokens file, and ``server.host = 127.0.0.2`` (loopback, but not the
default), so every listener can be checked to honour the host. Every
protocol is tried with and without the token, through the stock clients
where they can send one.
"""

from __future__ import annotations

import base64
import contextlib
import os
import queue
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance._generated import grps_pb2, grps_pb2_grpc, health_pb2, health_pb2_grpc
from appliance.protocols.mip.client import MipClient, MipReplyError, text_item
from appliance.protocols.mip.codec import ErrorCode
from tests.system.harness import Appliance, demo_models, running

HOST = "127.0.0.2"
TOKEN = "s3cret-token-for-tests-0123456789abcdef"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost, 127.0.0.1 and 127.0.0.2."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec"),
            *("-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=appliance-test"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:127.0.0.2"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    key.chmod(0o600)
    return cert, key


def write_tokens(path: Path, *tokens: str) -> None:
    path.write_text("# tokens for the security tests\n" + "".join(f"{t}\n" for t in tokens))
    path.chmod(0o600)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("secrets")
    cert, key = make_certificate(directory)
    tokens = directory / "tokens"
    write_tokens(tokens, "another-token", TOKEN)
    return {"cert": cert, "key": key, "tokens": tokens}


@pytest.fixture(scope="module")
def secure(secrets: dict[str, Path]) -> Iterator[Appliance]:
    with running(
        demo_models("simple", "forward", "echo"),
        server={"host": HOST},
        tls={"cert": str(secrets["cert"]), "key": str(secrets["key"])},
        auth={"tokens_file": str(secrets["tokens"])},
        mip={
            "listeners": [
                {"port": 0, "model": "echo"},
                {"port": 0, "model": "echo", "trusted": True},
            ]
        },
    ) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def https(secure: Appliance, secrets: dict[str, Path]) -> Iterator[str]:
    # Stock clients built on requests (umbridge, graphpipe) find the CA here.
    os.environ["REQUESTS_CA_BUNDLE"] = str(secrets["cert"])
    yield f"https://{HOST}:{secure.ports['http']}"
    del os.environ["REQUESTS_CA_BUNDLE"]


def get(url: str, **kwargs: Any) -> requests.Response:
    return requests.get(url, timeout=30, **kwargs)


def post(url: str, **kwargs: Any) -> requests.Response:
    return requests.post(url, timeout=30, **kwargs)


# -- where it listens ------------------------------------------------------------------


def test_every_listener_honours_server_host(secure: Appliance) -> None:
    master = psutil.Process(secure.process.pid)
    listening = set()
    for process in [master, *master.children(recursive=True)]:
        for conn in process.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                # gRPC binds an IPv6 socket to the v4-mapped address.
                listening.add((conn.laddr.ip.removeprefix("::ffff:"), conn.laddr.port))
    ports = {secure.ports["http"], secure.ports["grpc"]}
    ports |= {int(item["port"]) for item in secure.state["mip_listeners"]}
    assert len(ports) == 4
    assert {port for _ip, port in listening} == ports
    assert {ip for ip, _port in listening} == {HOST}
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()


# -- TLS -----------------------------------------------------------------------------------


def test_https_with_requests_and_plain_http_refused(secure: Appliance, https: str) -> None:
    assert get(f"{https}/v2/health/ready").status_code == 200
    assert get(f"{https}/v2", headers=BEARER).json()["name"] == "triton"
    with pytest.raises(requests.exceptions.ConnectionError):
        get(f"http://{HOST}:{secure.ports['http']}/v2/health/ready")
    with pytest.raises(requests.exceptions.SSLError):
        get(f"{https}/v2/health/ready", verify=requests.certs.where())  # an unknown CA


def simple_inputs(module: Any) -> list[Any]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        infer_input = module.InferInput(name, [1, 16], "INT32")
        infer_input.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(infer_input)
    return inputs


def test_tritonclient_over_https(secure: Appliance, secrets: dict[str, Path]) -> None:
    client = httpclient.InferenceServerClient(
        f"{HOST}:{secure.ports['http']}", ssl=True, ssl_options={"ca_certs": str(secrets["cert"])}
    )
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        with pytest.raises(InferenceServerException, match="unauthorized"):
            client.get_server_metadata()
        # tritonclient adds its own headers to the dict it is given.
        result = client.infer("simple", simple_inputs(httpclient), headers=dict(BEARER))
        assert result.as_numpy("OUTPUT0").tolist() == [list(range(0, 32, 2))]
    finally:
        client.close()


def test_tritonclient_over_grpc_ssl(secure: Appliance, secrets: dict[str, Path]) -> None:
    url = f"{HOST}:{secure.ports['grpc']}"
    client = grpcclient.InferenceServerClient(url, ssl=True, root_certificates=str(secrets["cert"]))
    metadata = {"authorization": f"Bearer {TOKEN}"}
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            client.get_server_metadata()
        with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
            client.infer("simple", simple_inputs(grpcclient), headers={"authorization": "x"})
        assert client.get_server_metadata(headers=metadata).name == "triton"
        result = client.infer("simple", simple_inputs(grpcclient), headers=metadata)
        assert result.as_numpy("OUTPUT1").tolist() == [[0] * 16]
        refused = stream_error(client, {})
        assert refused is not None
        assert "UNAUTHENTICATED" in str(refused)
        assert stream_error(client, metadata) is None
    finally:
        client.close()
    # Refused calls are answered, counted and logged like any other.
    log = secure.log()
    for method in ("ModelInfer", "ModelStreamInfer"):
        refusal = (
            rf"status=UNAUTHENTICATED latency_ms=\S+ /inference\.GRPCInferenceService/{method}\n"
        )
        assert re.search(refusal, log), method
    plain = grpcclient.InferenceServerClient(url)
    try:
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
    finally:
        plain.close()


def stream_error(
    client: grpcclient.InferenceServerClient, headers: dict[str, str]
) -> InferenceServerException | None:
    """Send one request on a fresh ModelStreamInfer stream; the error its answer carried."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), headers=headers
    )
    try:
        with contextlib.suppress(InferenceServerException):
            # A refused stream may end before this request is sent; the
            # callback has the reason either way.
            client.async_stream_infer("simple", simple_inputs(grpcclient))
        _result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    return error


# -- tokens on every protocol ------------------------------------------------------------------


def basic(user: str, password: str) -> dict[str, str]:
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {encoded}"}


def test_kserve_rest_needs_the_token(https: str) -> None:
    body = {
        "inputs": [
            {"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    url = f"{https}/v2/models/simple/infer"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        refused = post(url, json=body, headers=headers)
        assert refused.status_code == 401
        assert "unauthorized" in refused.json()["error"]
        assert "Bearer" in refused.headers["WWW-Authenticate"]
    for headers in (BEARER, basic("anyone", TOKEN), {"Authorization": "Bearer another-token"}):
        assert post(url, json=body, headers=headers).status_code == 200
    assert get(f"{https}/v2/health/live").status_code == 200
    assert get(f"{https}/v2/models/simple").status_code == 401


def test_openai_routes_need_the_token_as_an_api_key(https: str) -> None:
    refused = get(f"{https}/v1/models", headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    listed = get(f"{https}/v1/models", headers=BEARER).json()
    assert "simple" in {model["id"] for model in listed["data"]}


def test_grps_rest_needs_the_token_but_health_is_open(https: str) -> None:
    url = f"{https}/grps/v1/infer/predict?model=echo"
    refused = post(url, json={"str_data": "hi"})
    assert refused.status_code == 401
    assert refused.json()["status"] == {
        "code": 401,
        "msg": refused.json()["status"]["msg"],
        "status": "FAILURE",
    }
    assert post(url, json={"str_data": "hi"}, headers=BEARER).json()["str_data"] == "hi"
    for path in ("live", "ready"):
        assert get(f"{https}/grps/v1/health/{path}").status_code == 200
    # Going offline changes the host's state: it needs the token.
    assert get(f"{https}/grps/v1/health/offline").status_code == 401


def test_umbridge_stock_client_with_the_token_in_the_url(https: str) -> None:
    import umbridge

    # The stock client reads the 401 body as /Info's and misses its keys.
    with pytest.raises(KeyError, match="protocolVersion"):
        umbridge.HTTPModel(https, "forward")
    refused = get(f"{https}/Info")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "Unauthorized"
    model = umbridge.HTTPModel(https.replace("://", f"://user:{TOKEN}@"), "forward")
    assert model([[1.5]]) == [[3.0]]


@pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")
def test_graphpipe_stock_client_with_the_token_in_the_url(https: str) -> None:
    from graphpipe import remote

    array = np.arange(16, dtype=np.int32).reshape(1, 16)
    with pytest.raises(requests.exceptions.HTTPError, match="401"):
        remote.execute_multi(f"{https}/graphpipe/simple", [array, array], None, None)
    url = https.replace("://", f"://user:{TOKEN}@") + "/graphpipe/simple"
    doubled, zeros = remote.execute_multi(url, [array, array], None, None)
    assert doubled.tolist() == (2 * array).tolist()
    assert zeros.tolist() == [[0] * 16]


def test_the_page_and_metrics_need_the_token(https: str) -> None:
    for path in ("/", "/metrics"):
        refused = get(https + path, headers={"Accept": "text/html"})
        assert refused.status_code == 401
        assert refused.headers["Content-Type"].startswith("text/plain")
        assert get(https + path, headers={**BEARER, "Accept": "text/html"}).status_code == 200


def secure_channel(secure: Appliance, secrets: dict[str, Path]) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(secrets["cert"].read_bytes())
    return grpc.secure_channel(f"{HOST}:{secure.ports['grpc']}", credentials)


def test_grps_grpc_and_health_over_tls(secure: Appliance, secrets: dict[str, Path]) -> None:
    with secure_channel(secure, secrets) as channel:
        stub = grps_pb2_grpc.GrpsServiceStub(channel)
        message = grps_pb2.GrpsMessage(str_data="hello", model="echo")
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(message, timeout=30)
        assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
        metadata = [("authorization", f"Bearer {TOKEN}")]
        assert stub.Predict(message, metadata=metadata, timeout=30).str_data == "hello"
        assert stub.CheckLiveness(grps_pb2.GrpsMessage(), timeout=30).status.status == 1
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_untrusted_mip_answers_pings_and_refuses_work(secure: Appliance) -> None:
    untrusted, trusted = (int(item["port"]) for item in secure.state["mip_listeners"])
    with MipClient(HOST, untrusted) as client:
        client.ping()
        with pytest.raises(MipReplyError) as caught:
            client.infer([[text_item("hello")]])
        assert caught.value.code == ErrorCode.PROTOCOL
        assert "trusted" in caught.value.message
        with pytest.raises(ConnectionError):
            client.ping()  # the connection was closed
    with MipClient(HOST, trusted) as client:
        client.ping()
        [[(_kind, data)]] = client.infer([[text_item("hello")]])
        assert bytes(data) == b"hello"


def test_tokens_rotate_without_a_restart(https: str, secrets: dict[str, Path]) -> None:
    url = f"{https}/v2"
    try:
        write_tokens(secrets["tokens"], "rotated-token")
        deadline = time.monotonic() + 10
        while get(url, headers=BEARER).status_code != 401:
            assert time.monotonic() < deadline, "the old token is still accepted"
            time.sleep(0.2)
        assert get(url, headers={"Authorization": "Bearer rotated-token"}).status_code == 200
    finally:
        write_tokens(secrets["tokens"], "another-token", TOKEN)
        deadline = time.monotonic() + 10
        while get(url, headers=BEARER).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)


# -- nothing world-readable --------------------------------------------------------------------


def test_the_master_writes_nothing_others_can_read(secure: Appliance) -> None:
    # config.toml and appliance.log are the test harness's own files.
    made_by_harness = {"config.toml", "appliance.log"}
    paths = [p for p in secure.run_dir.rglob("*") if p.name not in made_by_harness]
    paths += [Path("/dev/shm") / name for name in secure.segments()]
    assert len(paths) > 10
    assert any(p.is_socket() for p in paths)
    assert any(p.name == "appliance.json" for p in paths)
    loose = {str(p): oct(p.lstat().st_mode & 0o777) for p in paths if p.lstat().st_mode & 0o077}
    assert not loose, f"readable or writable by others: {loose}"


def test_ssl_module_sees_the_certificate(secure: Appliance, secrets: dict[str, Path]) -> None:
    context = ssl.create_default_context(cafile=str(secrets["cert"]))
    with (
        socket.create_connection((HOST, secure.ports["http"]), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=HOST) as wrapped,
    ):
        assert wrapped.version() in ("TLSv1.2", "TLSv1.3")
