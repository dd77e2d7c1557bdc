"""GraphPipe over HTTP with the stock client (graphpipe 1.0.4) and our encoder."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from graphpipe import remote
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocols.graphpipe.errors import GraphPipeCode
from tests.system.harness import Appliance, demo_models, running
from tests.unit.test_graphpipe_encoder import (
    NUMPY_BY_TYPE,
    WT,
    decode_infer_response,
    decode_metadata_response,
    encode_infer_request,
    encode_metadata_request,
)

# graphpipe 1.0.4 calls EndVector(n), deprecated since flatbuffers 2.0.7.
pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

MODELS = [
    *demo_models("echo", "simple", "simple_string", "identity"),
    {"name": "flags", "class": "tests.graphpipe_models:Flags"},
    {"name": "slow", "class": "tests.models:Slow"},
    {"name": "broken", "class": "tests.models:BrokenLoad"},
]
MAX_TENSOR_BYTES = 2 << 20


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(
        MODELS, server={"default_model": "echo"}, shm={"max_tensor_bytes": MAX_TENSOR_BYTES}
    ) as running_appliance:
        yield running_appliance


@pytest.fixture(scope="module")
def base(appliance: Appliance) -> str:
    return f"http://127.0.0.1:{appliance.ports['http']}"


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


def url(base: str, model: str | None) -> str:
    return f"{base}/" if model is None else f"{base}/graphpipe/{model}"


def infer(
    session: requests.Session, base: str, model: str | None, body: bytes
) -> tuple[list[tuple[int, Any]], list[tuple[int, str]]]:
    reply = session.post(url(base, model), data=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return decode_infer_response(reply.content)


# -- the stock client ----------------------------------------------------------


@pytest.mark.parametrize("model", [None, "echo", "echo/"])
def test_execute_against_the_default_model_and_by_name(base: str, model: str | None) -> None:
    array = np.arange(12.0).reshape(3, 4)
    out = remote.execute(url(base, model), array)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, array)


def test_float64_from_the_client_is_converted_for_an_fp32_model(base: str) -> None:
    out = remote.execute(url(base, "identity"), np.array([[0.1, 2.5]]))
    assert out.dtype == np.float32
    assert out.tolist() == [[np.float32(0.1), 2.5]]


def test_execute_multi_with_python_ints_and_chosen_outputs(base: str) -> None:
    a, b = np.arange(16).reshape(1, 16), np.ones((1, 16), dtype=np.int64)
    total, diff = remote.execute_multi(url(base, "simple"), [a, b], None, None)
    assert total.dtype == np.int32
    assert (total.tolist(), diff.tolist()) == ((a + b).tolist(), (a - b).tolist())
    (only,) = remote.execute_multi(url(base, "simple"), [a, b], ["INPUT0", "INPUT1"], ["OUTPUT1"])
    assert only.tolist() == (a - b).tolist()


def test_strings_empty_and_0d_tensors_with_the_client(base: str) -> None:
    out = remote.execute_multi(
        url(base, "simple_string"), [np.array([["7"] * 16]), np.array([["2"] * 16])], None, None
    )
    assert out[0].tolist() == [[b"9"] * 16]
    assert out[1].tolist() == [[b"5"] * 16]
    assert remote.execute(url(base, None), np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert remote.execute(url(base, None), np.array(4, np.int16)).tolist() == 4
    assert remote.execute(url(base, None), np.array(["héllo", ""])).tolist() == [
        b"h\xc3\xa9llo",
        b"",
    ]


def test_metadata_of_a_declared_and_the_default_model(base: str) -> None:
    metadata = remote.metadata(url(base, "simple"))
    assert (metadata.Name(), metadata.Server()) == (b"simple", b"appliance")
    assert remote.get_input_names(url(base, "simple")) == ["INPUT0", "INPUT1"]
    assert remote.get_output_shapes(url(base, "simple")) == [[None, 16], [None, 16]]
    assert remote.get_output_types(url(base, "simple")) == [np.dtype(np.int32)] * 2
    default = remote.metadata(url(base, None))
    assert default.Name() == b"echo"
    assert default.InputsLength() == default.OutputsLength() == 0
    assert b"Generic" in default.Description()


def test_errors_raise_in_the_client_and_garbage_gets_400(base: str) -> None:
    with pytest.raises(Exception, match="unknown model: 'nope'"):
        remote.execute(url(base, "nope"), np.ones(2))
    with pytest.raises(Exception, match="has no input named 'BOGUS'"):
        remote.execute(url(base, "identity"), np.ones((1, 1)), input_name="BOGUS")
    with pytest.raises(requests.HTTPError, match="404"):
        remote.metadata(url(base, "nope"))
    reply = requests.post(url(base, None), data=b"garbage!", timeout=10)
    assert reply.status_code == 400
    assert reply.headers["content-type"].startswith("text/plain")
    assert "malformed request" in reply.text
    assert remote.execute(url(base, None), np.ones(1)).tolist() == [1.0]


# -- GET -----------------------------------------------------------------------


@pytest.mark.parametrize("model", [None, "simple"])
def test_get_answers_metadata_as_json(base: str, model: str | None) -> None:
    reply = requests.get(url(base, model), timeout=10)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("application/json")
    document = reply.json()
    assert set(document) == {"Name", "Version", "Server", "Description", "Inputs", "Outputs"}
    if model == "simple":
        assert document["Inputs"][0] == {
            "Name": "INPUT0",
            "Description": "",
            "Shape": [-1, 16],
            "Type": 6,
        }
    else:
        assert (document["Name"], document["Inputs"], document["Outputs"]) == ("echo", [], [])


def test_get_root_from_a_browser_is_the_page_and_unknown_models_404(base: str) -> None:
    page = requests.get(url(base, None), headers={"Accept": "text/html"}, timeout=10)
    assert page.headers["content-type"].startswith("text/html")
    assert "<html" in page.text.lower()
    assert requests.get(url(base, "nope"), timeout=10).status_code == 404
    assert requests.get(url(base, "broken"), timeout=10).status_code == 503


# -- our encoder: every type, BOOL, metadata requests --------------------------


@pytest.mark.parametrize("type_number", sorted(NUMPY_BY_TYPE))
def test_every_numeric_type_round_trips_through_echo(
    session: requests.Session, base: str, type_number: int
) -> None:
    dtype = np.dtype(NUMPY_BY_TYPE[type_number])
    arrays = [np.arange(6).astype(dtype).reshape(2, 3), np.zeros((0, 2), dtype), np.array(3, dtype)]
    outputs, errors = infer(session, base, None, encode_infer_request(arrays))
    assert errors == []
    assert [t for t, _ in outputs] == [type_number] * 3
    for sent, (_, back) in zip(arrays, outputs, strict=True):
        np.testing.assert_array_equal(back, sent, strict=True)


def test_strings_round_trip_through_echo(session: requests.Session, base: str) -> None:
    strings = WT(12, [2, 2], strings=[b"", b"\x00\xff", "é".encode(), b"x" * 1000])
    outputs, errors = infer(
        session, base, "echo", encode_infer_request([strings, WT(12, [0], strings=[])])
    )
    assert errors == []
    assert outputs[0][1].tolist() == [[b"", b"\x00\xff"], ["é".encode(), b"x" * 1000]]
    assert outputs[1][1].shape == (0,)


def test_bool_travels_as_uint8(session: requests.Session, base: str) -> None:
    outputs, errors = infer(
        session, base, "flags", encode_infer_request([np.array([1, 0, 1], np.uint8)])
    )
    assert errors == []
    assert outputs[0][0] == 1
    assert outputs[0][1].tolist() == [0, 1, 0]


@pytest.mark.parametrize("req_type", [2, 0, 9])
def test_a_request_that_is_not_infer_gets_metadata(
    session: requests.Session, base: str, req_type: int
) -> None:
    reply = session.post(url(base, "flags"), data=encode_metadata_request(req_type), timeout=10)
    assert reply.status_code == 200
    metadata = decode_metadata_response(reply.content)
    assert metadata.Name() == b"flags"
    io = metadata.Inputs(0)
    assert (io.Name(), io.Type(), io.ShapeAsNumpy().tolist()) == (b"flags", 1, [-1])
    assert b"BOOL" in io.Description()


def test_config_json_reaches_the_model_and_text_is_accepted(
    session: requests.Session, base: str
) -> None:
    x = np.zeros(2, np.float32)
    outputs, errors = infer(session, base, "slow", encode_infer_request([x], config="not json"))
    assert (errors, outputs[0][1].tolist()) == ([], [0.0, 0.0])
    _, errors = infer(session, base, "slow", encode_infer_request([x], config='{"fail": true}'))
    assert errors[0][0] == GraphPipeCode.MODEL_FAILED
    assert "asked to fail" in errors[0][1]


def test_a_chunked_body_is_read(session: requests.Session, base: str) -> None:
    body = encode_infer_request([np.arange(3, dtype=np.int8)])
    reply = session.post(url(base, None), data=iter([body[:10], body[10:]]), timeout=10)
    assert reply.status_code == 200
    outputs, _ = decode_infer_response(reply.content)
    assert outputs[0][1].tolist() == [0, 1, 2]


# -- every error code, and the server keeps serving ----------------------------

PAIR = np.ones((1, 16), np.int32)
ERROR_CASES: list[tuple[str, bytes, GraphPipeCode]] = [
    ("nope", encode_infer_request([PAIR]), GraphPipeCode.UNKNOWN_MODEL),
    ("broken", encode_infer_request([np.zeros(1, np.float32)]), GraphPipeCode.MODEL_NOT_READY),
    ("simple", encode_infer_request([PAIR, PAIR], ["INPUT0", "X"]), GraphPipeCode.UNKNOWN_INPUT),
    ("simple", encode_infer_request([PAIR]), GraphPipeCode.MISSING_INPUT),
    ("simple", encode_infer_request([PAIR, PAIR], ["INPUT0"]), GraphPipeCode.INPUT_NAMES),
    ("simple", encode_infer_request([PAIR, PAIR], (), ["OUT"]), GraphPipeCode.UNKNOWN_OUTPUT),
    ("echo", encode_infer_request([PAIR], (), ["nothing"]), GraphPipeCode.UNKNOWN_OUTPUT),
    ("simple", encode_infer_request([PAIR, PAIR * 1.0]), GraphPipeCode.TYPE_MISMATCH),
    ("identity", encode_infer_request([np.array([[1e300]])]), GraphPipeCode.VALUE_OUT_OF_RANGE),
    ("simple", encode_infer_request([PAIR, PAIR[:, :15]]), GraphPipeCode.SHAPE_MISMATCH),
    ("echo", encode_infer_request([WT(1, [-2], b"")]), GraphPipeCode.BAD_SHAPE),
    ("echo", encode_infer_request([WT(11, [2], b"\x00" * 15)]), GraphPipeCode.DATA_LENGTH),
    ("echo", encode_infer_request([WT(0, [1], b"\x00")]), GraphPipeCode.UNSUPPORTED_TYPE),
    ("echo", encode_infer_request([PAIR], config=b"\xff"), GraphPipeCode.BAD_CONFIG),
    ("simple", encode_infer_request([PAIR.repeat(2, 0), PAIR]), GraphPipeCode.BAD_REQUEST),
    (
        "echo",
        encode_infer_request([np.zeros(MAX_TENSOR_BYTES + 8, np.uint8)]),
        GraphPipeCode.TOO_LARGE,
    ),
]


@pytest.mark.parametrize(
    ("model", "body", "code"), ERROR_CASES, ids=[case[2].name for case in ERROR_CASES]
)
def test_each_error_has_its_code_and_the_server_keeps_serving(
    session: requests.Session, base: str, model: str, body: bytes, code: GraphPipeCode
) -> None:
    outputs, errors = infer(session, base, model, body)
    assert outputs == []
    assert len(errors) == 1
    assert errors[0][0] == code, errors
    assert errors[0][1]
    good, _ = infer(session, base, None, encode_infer_request([np.ones(1)]))
    assert good[0][1].tolist() == [1.0]


def test_a_dying_worker_is_reported_and_its_model_comes_back(
    session: requests.Session, base: str, appliance: Appliance
) -> None:
    body = encode_infer_request([np.zeros(1, np.float32)], config='{"abort": true}')
    _, errors = infer(session, base, "slow", body)
    assert errors[0][0] == GraphPipeCode.WORKER_LOST
    client = appliance.client()
    deadline = time.monotonic() + 30
    while not client.model_ready("slow") and time.monotonic() < deadline:
        time.sleep(0.1)
    outputs, errors = infer(session, base, "slow", encode_infer_request([np.ones(1, np.float32)]))
    assert (errors, outputs[0][1].tolist()) == ([], [1.0])


# -- malformed bodies ----------------------------------------------------------

VALID = encode_infer_request([np.arange(4, dtype=np.int32), np.array([b"ab"])], ["a", "b"])


@pytest.mark.parametrize("body", [b"", b"\x01", b"garbage!", VALID[: len(VALID) // 2]])
def test_malformed_bodies_get_400_text(session: requests.Session, base: str, body: bytes) -> None:
    for model in (None, "simple", "nope"):
        reply = session.post(url(base, model), data=body, timeout=10)
        assert reply.status_code == 400
        assert reply.headers["content-type"].startswith("text/plain")
        assert reply.text.startswith("graphpipe: malformed request:")


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.one_of(st.binary(max_size=300), st.data()))
def test_any_bytes_get_a_reply_or_400_never_500(
    session: requests.Session, base: str, drawn: Any
) -> None:
    body = drawn if isinstance(drawn, bytes) else _mutated(drawn)
    reply = session.post(url(base, None), data=body, timeout=30)
    assert reply.status_code in (200, 400), reply.text
    if reply.status_code == 400:
        assert reply.text.startswith("graphpipe: malformed request:")


def _mutated(data: st.DataObject) -> bytes:
    body = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    return bytes(body[: data.draw(st.integers(0, len(body)))])


def test_no_request_took_the_internal_error_path(appliance: Appliance) -> None:
    # Runs last: every earlier request was answered by design, not by the
    # catch-all that logs a traceback and answers 500.
    assert "appliance.graphpipe" not in appliance.log()
