"""Every codec against the golden wire files in tests/wire/.

The files are bytes the stock clients (tritonclient, umbridge, graphpipe,
KubeMo, and for GRPS requests' JSON and the GrpsMessage protobuf classes)
and the appliance exchanged, recorded by tools/capture_wire.py, with the
values sent and decoded in tests/wire/cases.json. For each case: the
appliance decodes the golden request into those inputs, the stock client's
own decoder reads the golden response into those outputs, and the appliance's
encoder, given those outputs, writes the golden response byte for byte.

The KServe gRPC checks of the appliance run in a child process (this file run
as a script): pbcodec's generated ``inference.*`` protobuf names clash with
tritonclient.grpc's, and the two cannot share a process. GRPS's do not: its
``grps.protos.v1`` names exist only in the appliance's grps_pb2, which is
therefore also the client's class here (it is wire-identical to the one
generated from GRPS's published grps.proto, which would clash with it).
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
WIRE = ROOT / "tests" / "wire"
CASES: dict[str, Any] = json.loads((WIRE / "cases.json").read_text())


def case(key: str) -> dict[str, Any]:
    entry: dict[str, Any] = CASES[key]
    return entry


def golden(key: str) -> tuple[bytes, bytes]:
    return (WIRE / f"{key}.request").read_bytes(), (WIRE / f"{key}.response").read_bytes()


def expected_arrays(tensors: list[dict[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    from appliance.core import dtypes
    from appliance.core.dtypes import DType

    arrays = {}
    for t in tensors:
        dtype = DType(t["datatype"])
        data = [s.encode() for s in t["data"]] if dtype is DType.BYTES else t["data"]
        arrays[t["name"]] = np.array(data, dtype=dtypes.to_numpy(dtype)).reshape(t["shape"])
    return arrays


def assert_arrays(got: dict[str, Any], want: dict[str, np.ndarray[Any, Any]]) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)


def test_every_case_has_its_files() -> None:
    assert sorted(CASES) == [
        "graphpipe/simple",
        "grps_grpc/gtensors",
        "grps_rest/gtensors",
        "grps_rest/str_data",
        "kserve_grpc/raw",
        "kserve_rest/binary",
        "kserve_rest/bytes",
        "kserve_rest/json",
        "mip/echo",
        "umbridge/evaluate",
    ]
    for key in CASES:
        request, response = golden(key)
        assert request, key
        assert response, key


# -- KServe REST ---------------------------------------------------------------


REST_CASES = ["kserve_rest/binary", "kserve_rest/json", "kserve_rest/bytes"]


def _binary(key: str) -> bool:
    return not key.endswith("json")


def _header_length(headers: dict[str, str]) -> int | None:
    value = headers.get("inference-header-content-length")
    return None if value is None else int(value)


@pytest.mark.parametrize("key", REST_CASES)
def test_kserve_rest_decodes_the_golden_request(key: str) -> None:
    from appliance.protocols.kserve import codec

    entry = case(key)
    request, _ = golden(key)
    decoded = codec.decode_infer_request(
        request, _header_length(entry["request_headers"]), entry["model"]
    )
    assert decoded.model == entry["model"]
    assert all(tensor.shm is None and tensor.data is not None for tensor in decoded.inputs)
    got = {tensor.name: tensor.data.array() for tensor in decoded.inputs if tensor.data}
    assert_arrays(got, expected_arrays(entry["inputs"]))
    binary = _binary(key)
    assert decoded.binary_output is binary
    if decoded.outputs is not None:
        assert [(o.name, o.binary) for o in decoded.outputs] == [
            (t["name"], binary) for t in entry["outputs"]
        ]


@pytest.mark.parametrize("key", REST_CASES)
def test_tritonclient_reads_the_golden_kserve_rest_response(key: str) -> None:
    from tritonclient.http import InferResult

    entry = case(key)
    _, response = golden(key)
    result = InferResult.from_response_body(
        response, header_length=_header_length(entry["response_headers"])
    )
    want = expected_arrays(entry["outputs"])
    assert_arrays({name: result.as_numpy(name) for name in want}, want)


@pytest.mark.parametrize("key", REST_CASES)
def test_kserve_rest_encodes_the_golden_response(key: str) -> None:
    from appliance.core.tensor import Tensor
    from appliance.protocols.kserve import codec
    from appliance.protocols.kserve.inference import OutputData

    entry = case(key)
    _, response = golden(key)
    outputs = [
        OutputData(name, Tensor.from_array(array), binary=_binary(key))
        for name, array in expected_arrays(entry["outputs"]).items()
    ]
    body, header_length = codec.encode_infer_response(
        entry["model"], entry["model_version"], "", outputs
    )
    assert body == response
    assert header_length == _header_length(entry["response_headers"])
    assert entry["status"] == 200


# -- KServe gRPC ---------------------------------------------------------------


def test_tritonclient_reads_the_golden_kserve_grpc_response() -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    entry = case("kserve_grpc/raw")
    _, response = golden("kserve_grpc/raw")
    result = grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(response))
    assert result.get_response().model_name == entry["model"]
    want = expected_arrays(entry["outputs"])
    assert_arrays({name: result.as_numpy(name) for name in want}, want)


def test_kserve_grpc_decodes_and_encodes_the_golden_messages() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert b"the golden gRPC messages hold" in done.stdout


def _grpc_child() -> None:
    from appliance.core.tensor import Tensor
    from appliance.protocols.kserve import pbcodec
    from appliance.protocols.kserve.inference import OutputData

    entry = case("kserve_grpc/raw")
    request, response = golden("kserve_grpc/raw")
    decoded = pbcodec.decode_infer_request(pbcodec.pb.ModelInferRequest.FromString(request))
    assert decoded.model == entry["model"]
    got = {tensor.name: tensor.data.array() for tensor in decoded.inputs if tensor.data}
    assert_arrays(got, expected_arrays(entry["inputs"]))
    outputs = [
        OutputData(name, Tensor.from_array(array), binary=True)
        for name, array in expected_arrays(entry["outputs"]).items()
    ]
    encoded = pbcodec.encode_infer_response(entry["model"], entry["model_version"], "", outputs)
    assert encoded == response, (encoded, response)
    print("the golden gRPC messages hold")


# -- UM-Bridge -----------------------------------------------------------------


def _forward() -> Any:
    from appliance.core.metadata import ModelMetadata
    from appliance.demos.forward import Forward
    from appliance.protocols.umbridge.codec import interface_of

    supports = {"predict": True}
    metadata = ModelMetadata(
        "forward",
        ("1",),
        "python",
        tuple(Forward.inputs),
        tuple(Forward.outputs),
        Forward.max_batch_size,
        supports,
    )
    return interface_of(metadata)


def test_umbridge_decodes_the_golden_request() -> None:
    from appliance.protocols.umbridge import codec

    entry = case("umbridge/evaluate")
    request, _ = golden("umbridge/evaluate")
    body = codec.decode_body(request)
    assert codec.read_name(body) == entry["model"]
    assert codec.read_config(body) is None
    vectors = codec.read_inputs(body, _forward())
    assert [vector.tolist() for vector in vectors] == entry["inputs"]


def test_umbridge_client_reads_the_golden_response() -> None:
    # HTTPModel.__call__ reads the reply as JSON and returns its "output".
    entry = case("umbridge/evaluate")
    _, response = golden("umbridge/evaluate")
    assert json.loads(response)["output"] == entry["outputs"]


def test_umbridge_encodes_the_golden_response() -> None:
    from appliance.protocols.umbridge import codec

    entry = case("umbridge/evaluate")
    _, response = golden("umbridge/evaluate")
    vectors = [np.array(vector, dtype=np.float64) for vector in entry["outputs"]]
    assert codec.encode_outputs(vectors) == response


# -- GraphPipe -----------------------------------------------------------------


def test_graphpipe_decodes_the_golden_request() -> None:
    from appliance.protocols.graphpipe import codec
    from appliance.protocols.graphpipe.request import InferRequest

    entry = case("graphpipe/simple")
    request, _ = golden("graphpipe/simple")
    decoded = codec.decode_request(request)
    assert isinstance(decoded, InferRequest)
    assert decoded.output_names == [t["name"] for t in entry["outputs"]]
    got = {
        name: codec.to_tensor(wire, name).array()
        for name, wire in zip(decoded.input_names, decoded.inputs, strict=True)
    }
    assert_arrays(got, expected_arrays(entry["inputs"]))


def test_graphpipe_client_reads_the_golden_response() -> None:
    from graphpipe import convert

    entry = case("graphpipe/simple")
    _, response = golden("graphpipe/simple")
    outputs, errors = convert.deserialize_infer_response(response)
    assert errors == []
    want = expected_arrays(entry["outputs"])
    assert_arrays(dict(zip(want, outputs, strict=True)), want)


def test_graphpipe_encodes_the_golden_response() -> None:
    from appliance.core.tensor import Tensor
    from appliance.protocols.graphpipe import codec

    entry = case("graphpipe/simple")
    _, response = golden("graphpipe/simple")
    outputs = [Tensor.from_array(a) for a in expected_arrays(entry["outputs"]).values()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert codec.encode_infer_response(outputs) == response


# -- MIP -----------------------------------------------------------------------


def _mip_payload(frame: bytes, subtype: int) -> bytes:
    from appliance.protocols.mip.codec import HEADER, Kind, decode_header

    header = decode_header(frame[: HEADER.size])
    assert (header.kind, header.subtype) == (Kind.INFERENCE, subtype)
    assert header.remaining == len(frame) - HEADER.size
    return frame[HEADER.size :]


def _mip_value(item_type: str, data: bytes) -> Any:
    return json.loads(data) if item_type == "JSON" else data.decode()


def test_mip_decodes_the_golden_request() -> None:
    from appliance.protocols.mip.codec import Subtype, decode_infer_request

    entry = case("mip/echo")
    request, _ = golden("mip/echo")
    decoded = decode_infer_request(_mip_payload(request, Subtype.REQUEST))
    assert (decoded.n_input, decoded.batch_size) == (len(entry["inputs"]), 1)
    got = [
        {"type": item.type.name, "data": _mip_value(item.type.name, bytes(item.data))}
        for item in decoded.items
    ]
    assert got == entry["inputs"]


def test_kubemo_reads_the_golden_response() -> None:
    from kubemo.protocol import INFERENCE_HEADER_FMT, decode_single_input
    from kubemo.serialize import Dynamic

    from appliance.protocols.mip.codec import ItemType, Subtype

    entry = case("mip/echo")
    _, response = golden("mip/echo")
    # As Client.inference reads the payload after the fixed header.
    reader = io.BytesIO(_mip_payload(response, Subtype.RESPONSE))
    _, n_output, batch_size = struct.unpack(INFERENCE_HEADER_FMT, reader.read(4))
    assert batch_size == 1
    outputs = [Dynamic(*decode_single_input(reader)) for _ in range(n_output)]
    got = [{"type": ItemType(o.serial.kind).name, "data": o.decode()} for o in outputs]
    assert got == entry["outputs"]


def test_mip_encodes_the_golden_response() -> None:
    from appliance.protocols.mip.codec import ItemType, encode_infer_response, encode_item

    entry = case("mip/echo")
    request, response = golden("mip/echo")
    items = []
    for output, sent in zip(entry["outputs"], golden_items(request), strict=True):
        # JSON text has many spellings; the echo returns the client's bytes.
        data = output["data"].encode() if output["type"] == "TEXT" else sent
        assert _mip_value(output["type"], data) == output["data"]
        items += encode_item(ItemType[output["type"]], [data])
    n_input = len(entry["inputs"])
    encoded = encode_infer_response(n_input, len(entry["outputs"]), 1, items)
    assert encoded == response


def golden_items(request: bytes) -> list[bytes]:
    from appliance.protocols.mip.codec import Subtype, decode_infer_request

    decoded = decode_infer_request(_mip_payload(request, Subtype.REQUEST))
    return [bytes(item.data) for item in decoded.items]


# -- GRPS ----------------------------------------------------------------------

GRPS_CASES = ["grps_rest/gtensors", "grps_rest/str_data", "grps_grpc/gtensors"]


def _grps_rest(key: str) -> bool:
    return key.startswith("grps_rest/")


def _grps_metadata(model: str) -> Any:
    from appliance.core.metadata import ModelMetadata
    from appliance.demos.echo import Echo
    from appliance.demos.simple import Simple

    demo = {"simple": Simple, "echo": Echo}[model]
    inputs = None if demo.inputs is None else tuple(demo.inputs)
    outputs = None if demo.outputs is None else tuple(demo.outputs)
    return ModelMetadata(model, ("1",), "python", inputs, outputs, demo.max_batch_size)


def _grps_decode(key: str) -> Any:
    from appliance.protocols.grps import codec, pbcodec

    request, _ = golden(key)
    if _grps_rest(key):
        return codec.decode_json_request(request)
    return pbcodec.decode_message(pbcodec.GrpsMessage.FromString(request))


def _grps_reply_arrays(message: dict[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """A reply GrpsMessage's data, read as GRPS's clients read proto3 JSON.

    str_data is the one-element BYTES tensor echo answers it with.
    """
    if "str_data" in message:
        return {"str_data": np.array([message["str_data"].encode()], dtype=object)}
    arrays = {}
    for t in message["gtensors"]["tensors"]:
        numpy_type = t["dtype"].removeprefix("DT_").lower()
        arrays[t["name"]] = np.array(t[f"flat_{numpy_type}"], dtype=numpy_type).reshape(t["shape"])
    return arrays


@pytest.mark.parametrize("key", GRPS_CASES)
def test_grps_decodes_the_golden_request(key: str) -> None:
    from appliance.protocols.grps.bind import bind
    from appliance.protocols.grps.codec import JSON_TYPE

    entry = case(key)
    if _grps_rest(key):
        # rest.decode_body takes exactly this Content-Type.
        assert entry["request_headers"]["content-type"] == JSON_TYPE
    payload = _grps_decode(key)
    assert (payload.kind, payload.model) == (entry["payload"], entry["model"])
    bound = bind(payload, _grps_metadata(entry["model"]))
    got = {name: tensor.array() for name, tensor in bound.items()}
    assert_arrays(got, expected_arrays(entry["inputs"]))


@pytest.mark.parametrize("key", GRPS_CASES)
def test_grps_client_reads_the_golden_response(key: str) -> None:
    from google.protobuf import json_format

    from appliance._generated import grps_pb2

    entry = case(key)
    _, response = golden(key)
    if _grps_rest(key):
        message = json.loads(response)
    else:
        reply = grps_pb2.GrpsMessage.FromString(response)
        message = json_format.MessageToDict(reply, preserving_proto_field_name=True)
    assert message["status"] == {"code": 200, "msg": "OK", "status": "SUCCESS"}
    assert_arrays(_grps_reply_arrays(message), expected_arrays(entry["outputs"]))


@pytest.mark.parametrize("key", GRPS_CASES)
def test_grps_encodes_the_golden_response(key: str) -> None:
    from appliance.core.tensor import Tensor
    from appliance.protocols.grps import codec, pbcodec
    from appliance.protocols.grps.bind import ReplyShaper

    entry = case(key)
    _, response = golden(key)
    outputs = {name: Tensor.from_array(a) for name, a in expected_arrays(entry["outputs"]).items()}
    # The reply takes the request's kind, as service.predict_async shapes it.
    reply = ReplyShaper(_grps_decode(key)).shape(outputs)
    assert reply.kind == entry["payload"]
    if _grps_rest(key):
        assert entry["response_headers"]["content-type"] == codec.REPLY_TYPE
        assert entry["status"] == 200
        assert codec.encode_json_reply(reply) == response
    else:
        assert pbcodec.encode_message(reply).SerializeToString() == response


if __name__ == "__main__":
    _grpc_child()
