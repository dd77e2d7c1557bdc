"""Capture the golden wire files in tests/wire/ from the stock clients.

Run by hand (``make wire-capture``), and only when a wire format changes on
purpose: the files are what the stock clients and the appliance say to each
other today, and tests/unit/test_wire_golden.py holds every codec to them.

It starts an appliance with the demo models and puts a recording TCP relay
on 127.0.0.1 between each stock client and the appliance's port, so the
bytes are those the client really sent and the appliance really answered.
gRPC is the exception: HTTP/2 framing is not worth parsing, so the request
is the message the client's own classes build (tritonclient's
ModelInferRequest, a GRPS GrpsMessage), and the response is what the
appliance answers to exactly those bytes.

GRPS's clients are plain HTTP/JSON (``requests``, as GRPS's example clients)
and, for gRPC, the classes generated from GRPS's grps.proto. The appliance's
appliance/_generated/grps_pb2 stands in for those: protos/grps.proto differs
from GRPS's published file only in C++ codegen options and comments, so a
message serializes to the same bytes, and both register ``grps.proto`` in
protobuf's default pool, so the two cannot be imported into one process.

Each case writes ``tests/wire/<protocol>/<case>.request`` and ``.response``
(HTTP bodies, or whole MIP frames) and an entry in ``tests/wire/cases.json``
with the method, path, headers that matter, status, and the inputs sent and
outputs the stock client decoded, as plain values.
"""

from __future__ import annotations

import io
import json
import re
import socket
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.system.harness import Appliance, demo_models, running  # noqa: E402

WIRE = ROOT / "tests" / "wire"
KEPT_HEADERS = ("content-type", "inference-header-content-length")


# -- the recording relay ----------------------------------------------------------


@dataclass
class Recording:
    """Both directions of each connection the relay carried, in order."""

    sent: list[bytearray] = field(default_factory=list)
    received: list[bytearray] = field(default_factory=list)


@contextmanager
def relay(target_port: int) -> Iterator[tuple[int, Recording]]:
    """Listen on 127.0.0.1; carry one connection at a time to ``target_port``."""
    recording = Recording()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", target_port))
            sent, received = bytearray(), bytearray()
            recording.sent.append(sent)
            recording.received.append(received)
            pumps = [
                threading.Thread(target=pump, args=(client, upstream, sent)),
                threading.Thread(target=pump, args=(upstream, client, received)),
            ]
            for thread in pumps:
                thread.start()
            for thread in pumps:
                thread.join()
            client.close()
            upstream.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], recording
    finally:
        # shutdown, not just close, wakes the accept() blocked in serve().
        with suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)


def pump(source: socket.socket, sink: socket.socket, into: bytearray) -> None:
    while True:
        try:
            chunk = source.recv(1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            # Half-close, so the other side sees the end and its pump ends too.
            for sock in (sink, source):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_WR if sock is sink else socket.SHUT_RD)
            return
        into += chunk
        sink.sendall(chunk)


@dataclass
class Message:
    start: str
    headers: dict[str, str]
    body: bytes


def http_messages(stream: bytes) -> list[Message]:
    """Split an HTTP/1.1 stream into messages, each body by its Content-Length."""
    messages = []
    while stream:
        head, _, rest = stream.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        messages.append(Message(lines[0], headers, rest[:length]))
        stream = rest[length:]
    return messages


def exchange(recording: Recording, path: str) -> tuple[Message, Message]:
    """The request to ``path`` and its response, from the relay's streams."""
    for sent, received in zip(recording.sent, recording.received, strict=True):
        pairs = zip(http_messages(bytes(sent)), http_messages(bytes(received)), strict=True)
        for request, response in pairs:
            if request.start.split(" ")[1] == path:
                return request, response
    raise LookupError(f"no request to {path} went through the relay")


# -- writing a case ------------------------------------------------------------------


def tensor(name: str, array: Any) -> dict[str, Any]:
    """A tensor as plain values; BYTES elements as UTF-8 strings."""
    from tritonclient.utils import np_to_triton_dtype

    array = np.asarray(array)
    data = array.reshape(-1).tolist()
    if array.dtype == object:
        data = [element.decode() for element in data]
    return {
        "name": name,
        "datatype": np_to_triton_dtype(array.dtype),
        "shape": list(array.shape),
        "data": data,
    }


def kept(headers: dict[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in KEPT_HEADERS if name in headers}


def write(
    cases: dict[str, Any], protocol: str, case: str, request: bytes, response: bytes, **entry: Any
) -> None:
    folder = WIRE / protocol
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{case}.request").write_bytes(request)
    (folder / f"{case}.response").write_bytes(response)
    cases[f"{protocol}/{case}"] = {"protocol": protocol, "case": case, **entry}
    print(f"captured {protocol}/{case}: {len(request)} + {len(response)} bytes")


def http_entry(request: Message, response: Message) -> dict[str, Any]:
    method, path, _ = request.start.split(" ", 2)
    return {
        "method": method,
        "path": path,
        "request_headers": kept(request.headers),
        "status": int(response.start.split(" ")[1]),
        "response_headers": kept(response.headers),
    }


# -- the cases -------------------------------------------------------------------------

SIMPLE_INPUTS = {
    "INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16),
    "INPUT1": np.ones((1, 16), dtype=np.int32),
}
OUTPUT_NAMES = ("OUTPUT0", "OUTPUT1")


STRING_INPUTS = {
    "INPUT0": np.array([[str(i).encode() for i in range(16)]], dtype=object),
    "INPUT1": np.array([[b"1"] * 16], dtype=object),
}
# (case, model, inputs, binary tensors): tritonclient's default, JSON tensors,
# and BYTES tensors with their per-element length prefixes.
REST_CASES = (
    ("binary", "simple", SIMPLE_INPUTS, True),
    ("json", "simple", SIMPLE_INPUTS, False),
    ("bytes", "simple_string", STRING_INPUTS, True),
)


def kserve_rest(app: Appliance, cases: dict[str, Any]) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    for case, model, sent, binary in REST_CASES:
        with relay(app.ports["http"]) as (port, recording):
            client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
            inputs = []
            for name, array in sent.items():
                dtype = np_to_triton_dtype(array.dtype)
                item = httpclient.InferInput(name, list(array.shape), dtype)
                item.set_data_from_numpy(array, binary_data=binary)
                inputs.append(item)
            outputs = None
            if not binary:
                outputs = [
                    httpclient.InferRequestedOutput(n, binary_data=False) for n in OUTPUT_NAMES
                ]
            result = client.infer(model, inputs, outputs=outputs)
            client.close()
        request, response = exchange(recording, f"/v2/models/{model}/infer")
        write(
            cases,
            "kserve_rest",
            case,
            request.body,
            response.body,
            **http_entry(request, response),
            model=model,
            model_version=result.get_response()["model_version"],
            inputs=[tensor(n, a) for n, a in sent.items()],
            outputs=[tensor(n, result.as_numpy(n)) for n in OUTPUT_NAMES],
        )


def kserve_grpc(app: Appliance, cases: dict[str, Any]) -> None:
    import grpc
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import _utils, service_pb2

    inputs = []
    for name, array in SIMPLE_INPUTS.items():
        item = grpcclient.InferInput(name, list(array.shape), "INT32")
        item.set_data_from_numpy(array)
        inputs.append(item)
    message = _utils._get_inference_request(
        model_name="simple",
        inputs=inputs,
        model_version="",
        request_id="",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    request = message.SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{app.ports['grpc']}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)
        response = call(request, timeout=30)
    result = grpcclient.InferResult(service_pb2.ModelInferResponse.FromString(response))
    write(
        cases,
        "kserve_grpc",
        "raw",
        request,
        response,
        method="ModelInfer",
        path="/inference.GRPCInferenceService/ModelInfer",
        model="simple",
        model_version=result.get_response().model_version,
        inputs=[tensor(n, a) for n, a in SIMPLE_INPUTS.items()],
        outputs=[tensor(n, result.as_numpy(n)) for n in OUTPUT_NAMES],
    )


UMBRIDGE_INPUT = [[1.5]]


def umbridge(app: Appliance, cases: dict[str, Any]) -> None:
    import umbridge as umbridge_client

    with relay(app.ports["http"]) as (port, recording):
        model = umbridge_client.HTTPModel(f"http://127.0.0.1:{port}", "forward", use_shmem=False)
        result = model(UMBRIDGE_INPUT)
    request, response = exchange(recording, "/Evaluate")
    write(
        cases,
        "umbridge",
        "evaluate",
        request.body,
        response.body,
        **http_entry(request, response),
        model="forward",
        inputs=UMBRIDGE_INPUT,
        outputs=result,
    )


def graphpipe(app: Appliance, cases: dict[str, Any]) -> None:
    from graphpipe import remote

    with relay(app.ports["http"]) as (port, recording), warnings.catch_warnings():
        # graphpipe 1.0.4 calls EndVector(n), deprecated since flatbuffers 2.0.7.
        warnings.filterwarnings("ignore", "numElems is deprecated", DeprecationWarning)
        uri = f"http://127.0.0.1:{port}/graphpipe/simple"
        names = list(SIMPLE_INPUTS)
        result = remote.execute_multi(uri, list(SIMPLE_INPUTS.values()), names, list(OUTPUT_NAMES))
    request, response = exchange(recording, "/graphpipe/simple")
    write(
        cases,
        "graphpipe",
        "simple",
        request.body,
        response.body,
        **http_entry(request, response),
        model="simple",
        inputs=[tensor(n, a) for n, a in SIMPLE_INPUTS.items()],
        outputs=[tensor(n, a) for n, a in zip(OUTPUT_NAMES, result, strict=True)],
    )


MIP_TEXT = "hello, MIP"
MIP_JSON = {"a": 1, "list": [1, 1.5]}


def mip(app: Appliance, cases: dict[str, Any]) -> None:
    from kubemo.client import Client
    from kubemo.serialize import Json, Text

    from appliance.protocols.mip.codec import ItemType

    # PROTOCOL-FACTS §4.3: Json(obj) breaks the stock client; bytes work.
    items = (Text(MIP_TEXT), Json(io.BytesIO(json.dumps(MIP_JSON).encode())))
    with relay(app.ports["mip"]) as (port, recording):
        [outputs] = Client().inference(f"tcp://127.0.0.1:{port}", (items,))
    write(
        cases,
        "mip",
        "echo",
        bytes(recording.sent[0]),
        bytes(recording.received[0]),
        method="inference",
        model="echo",
        inputs=[{"type": "TEXT", "data": MIP_TEXT}, {"type": "JSON", "data": MIP_JSON}],
        outputs=[{"type": ItemType(o.serial.kind).name, "data": o.decode()} for o in outputs],
    )


GRPS_PREDICT = "/grps/v1/infer/predict"
GRPS_PREDICT_RPC = "/grps.protos.v1.GrpsService/Predict"
# Not ASCII, so the files pin both spellings: requests escapes it (\u2713),
# the appliance answers it as raw UTF-8.
GRPS_TEXT = "hello, GRPS \u2713"


def grps_gtensors(arrays: dict[str, Any]) -> dict[str, Any]:
    """Numeric arrays as GrpsMessage.gtensors in proto3 JSON, as GRPS's clients write it."""
    return {
        "tensors": [
            {
                "name": name,
                "dtype": f"DT_{array.dtype.name.upper()}",
                "shape": list(array.shape),
                f"flat_{array.dtype.name}": array.reshape(-1).tolist(),
            }
            for name, array in arrays.items()
        ]
    }


def grps_outputs(message: dict[str, Any]) -> dict[str, Any]:
    """A reply GrpsMessage (proto3 JSON) as arrays: what the client read from it.

    str_data comes back as the one-element BYTES tensor a generic model such
    as echo answers it with (see appliance/protocols/grps/bind.py).
    """
    if "str_data" in message:
        return {"str_data": np.array([message["str_data"].encode()], dtype=object)}
    arrays = {}
    for t in message["gtensors"]["tensors"]:
        numpy_type = t["dtype"].removeprefix("DT_").lower()
        flat = np.array(t[f"flat_{numpy_type}"], dtype=numpy_type)
        arrays[t["name"]] = flat.reshape(t["shape"])
    return arrays


# (case = the payload kind, model, JSON body): gtensors for simple, and
# str_data for echo. GRPS_BOUND holds the tensors each model is given: echo
# sees str_data as a one-element BYTES tensor named str_data (bind.py).
GRPS_REST_CASES = (
    ("gtensors", "simple", {"model": "simple", "gtensors": grps_gtensors(SIMPLE_INPUTS)}),
    ("str_data", "echo", {"model": "echo", "str_data": GRPS_TEXT}),
)
GRPS_BOUND = {
    "simple": SIMPLE_INPUTS,
    "echo": {"str_data": np.array([GRPS_TEXT.encode()], dtype=object)},
}


def grps_rest(app: Appliance, cases: dict[str, Any]) -> None:
    import requests

    for case, model, body in GRPS_REST_CASES:
        with relay(app.ports["http"]) as (port, recording):
            # requests.post closes its session, so the relay's connection ends.
            reply = requests.post(f"http://127.0.0.1:{port}{GRPS_PREDICT}", json=body, timeout=30)
            reply.raise_for_status()
            answer = reply.json()
        request, response = exchange(recording, GRPS_PREDICT)
        write(
            cases,
            "grps_rest",
            case,
            request.body,
            response.body,
            **http_entry(request, response),
            model=model,
            payload=case,
            inputs=[tensor(n, a) for n, a in GRPS_BOUND[model].items()],
            outputs=[tensor(n, a) for n, a in grps_outputs(answer).items()],
        )


def grps_grpc(app: Appliance, cases: dict[str, Any]) -> None:
    import grpc
    from google.protobuf import json_format

    from appliance._generated import grps_pb2

    # Built as GRPS's example gRPC client builds it.
    message = grps_pb2.GrpsMessage(model="simple")
    for name, array in SIMPLE_INPUTS.items():
        item = grps_pb2.GenericTensor(
            name=name,
            dtype=grps_pb2.DT_INT32,
            shape=list(array.shape),
            flat_int32=array.reshape(-1).tolist(),
        )
        message.gtensors.tensors.append(item)
    request = message.SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{app.ports['grpc']}") as channel:
        # No (de)serializers: the bytes go out and come back as they are.
        call = channel.unary_unary(GRPS_PREDICT_RPC, None, None)
        response = call(request, timeout=30)
    reply = grps_pb2.GrpsMessage.FromString(response)
    # GRPS's gRPC calls end OK even when they fail; the status says which.
    if reply.status.status != grps_pb2.Status.SUCCESS:
        raise RuntimeError(f"GRPS Predict failed: {reply.status}")
    answer = json_format.MessageToDict(reply, preserving_proto_field_name=True)
    write(
        cases,
        "grps_grpc",
        "gtensors",
        request,
        response,
        method="Predict",
        path=GRPS_PREDICT_RPC,
        model="simple",
        payload="gtensors",
        inputs=[tensor(n, a) for n, a in SIMPLE_INPUTS.items()],
        outputs=[tensor(n, a) for n, a in grps_outputs(answer).items()],
    )


CAPTURES: tuple[Callable[[Appliance, dict[str, Any]], None], ...] = (
    kserve_rest,
    kserve_grpc,
    umbridge,
    graphpipe,
    mip,
    grps_rest,
    grps_grpc,
)


def main() -> None:
    cases: dict[str, Any] = {}
    models = demo_models("simple", "simple_string", "forward", "echo")
    with running(models, server={"default_model": "echo"}) as app:
        for capture in CAPTURES:
            capture(app, cases)
    (WIRE / "cases.json").write_text(dumps(cases))


def dumps(cases: dict[str, Any]) -> str:
    """Indented JSON, with arrays of plain values kept on one line."""
    text = json.dumps(cases, indent=2, sort_keys=True)
    flat = re.sub(r"\[\s*([^\[\]{}]*?)\s*\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    return flat + "\n"


if __name__ == "__main__":
    main()
