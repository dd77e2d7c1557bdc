"""One request over each wire protocol, as bench_peers.py's client processes make it.

A target spec (a dict) names the protocol, where the server listens and the
payload; :func:`make_call` returns a call that sends one request with the
protocol's stock client (tritonclient for KServe v2, GRPS's stubs and JSON,
GraphPipe's converter, plain JSON for UM-Bridge, our MIP client) and checks
the reply. Payloads:

- ``{"model": "identity", "nbytes": n}``: an FP32 [1, n/4] tensor, sent back;
- ``{"model": "digits"}``: one 8x8 image (the held-out set's first) in, ten
  class probabilities out.

The same call serves the appliance and a peer: only ``url`` (host:port) differs.
With ``"new_connection": true`` an HTTP call opens a connection per request,
as clients that use a bare ``requests.post`` do: UM-Bridge's own client
(``umbridge.HTTPModel``), GraphPipe's ``remote.execute``, curl-style scripts;
KServe REST sends tritonclient's body that way.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.loadgen import tensor

ROOT = Path(__file__).resolve().parents[1]
HOLDOUT = ROOT / "tests" / "data" / "digits_holdout.npz"
# Modules every client process imports once, before any measurement.
PRELOAD = ("tritonclient.grpc", "tritonclient.http", "requests", "umbridge", "bench.callers")
MAX_MESSAGE_BYTES = 1 << 30
REGIONS = count()

Call = Callable[[], None]


class Payload:
    """What one request carries: the model, its tensors' names, the input, a check."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.model = str(spec.get("served_as", spec["model"]))
        if spec["model"] == "digits":
            with np.load(HOLDOUT) as data:
                self.x = data["X"][:1].astype(np.float32)
            self.input, self.output, self.out_shape = "pixels", "probabilities", (1, 10)
        else:
            self.x = tensor(int(spec["nbytes"]))
            self.input, self.output, self.out_shape = "INPUT0", "OUTPUT0", self.x.shape

    def check(self, y: Any) -> None:
        """Raise unless ``y`` is the reply this payload expects."""
        y = np.asarray(y, dtype=np.float32).reshape(-1)
        want = int(np.prod(self.out_shape))
        if y.size != want:
            raise AssertionError(f"{self.model} replied {y.size} values, expected {want}")
        if self.output == "OUTPUT0" and (y[0] != self.x[0, 0] or y[-1] != self.x[0, -1]):
            raise AssertionError(f"{self.model} returned other data than it was sent")
        if self.output == "probabilities" and abs(float(y.sum()) - 1.0) > 1e-3:
            raise AssertionError(f"{self.model} probabilities sum to {y.sum()}")


def make_call(spec: dict[str, Any], shared: dict[str, Any]) -> Call:
    """Return one call for ``spec`` (see the module docstring)."""
    del shared  # every call owns its connection: calls run on their own threads
    warnings.simplefilter("ignore", DeprecationWarning)  # graphpipe 1.0.4's flatbuffers use
    payload = Payload(spec)
    return BUILDERS[spec["protocol"]](spec, payload)


class Closing:
    """A call with a close() that releases what it holds."""

    def __init__(self, call: Call, *closers: Callable[[], object]) -> None:
        self.call, self.closers = call, closers

    def __call__(self) -> None:
        self.call()

    def close(self) -> None:
        for closer in self.closers:
            closer()


def kserve_grpc(spec: dict[str, Any], payload: Payload) -> Call:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(spec["url"])
    x = payload.x

    def call() -> None:
        value = grpcclient.InferInput(payload.input, list(x.shape), "FP32")
        value.set_data_from_numpy(x)
        wanted = [grpcclient.InferRequestedOutput(payload.output)]
        result = client.infer(payload.model, [value], outputs=wanted)
        payload.check(result.as_numpy(payload.output))

    return Closing(call, client.close)


def kserve_rest(spec: dict[str, Any], payload: Payload) -> Call:
    """tritonclient.http; ``binary`` false sends and asks for JSON tensors."""
    import tritonclient.http as httpclient

    binary = spec.get("binary", True)
    if spec.get("new_connection"):
        return kserve_rest_per_connection(spec, payload, binary)
    client = httpclient.InferenceServerClient(
        spec["url"], connection_timeout=120.0, network_timeout=120.0
    )
    x = payload.x

    def call() -> None:
        value = httpclient.InferInput(payload.input, list(x.shape), "FP32")
        value.set_data_from_numpy(x, binary_data=binary)
        wanted = [httpclient.InferRequestedOutput(payload.output, binary_data=binary)]
        result = client.infer(payload.model, [value], outputs=wanted)
        payload.check(result.as_numpy(payload.output))

    return Closing(call, client.close)


def kserve_rest_per_connection(spec: dict[str, Any], payload: Payload, binary: bool) -> Call:
    """tritonclient.http's request body and reply parsing, a connection per request."""
    import requests
    import tritonclient.http as httpclient

    url = f"http://{spec['url']}/v2/models/{payload.model}/infer"
    x = payload.x

    def call() -> None:
        value = httpclient.InferInput(payload.input, list(x.shape), "FP32")
        value.set_data_from_numpy(x, binary_data=binary)
        wanted = [httpclient.InferRequestedOutput(payload.output, binary_data=binary)]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [value], outputs=wanted
        )
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        reply = requests.post(url, data=body, headers=headers, timeout=120)
        reply.raise_for_status()
        length = reply.headers.get("Inference-Header-Content-Length")
        result = httpclient.InferenceServerClient.parse_response_body(
            reply.content, header_length=int(length) if length else None
        )
        payload.check(result.as_numpy(payload.output))

    return call


def kserve_shm(spec: dict[str, Any], payload: Payload, rest: bool = False) -> Call:
    """tritonclient.grpc (or .http) with system shared memory for the input and the output."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    module: Any = httpclient if rest else grpcclient
    client: Any = (
        httpclient.InferenceServerClient(
            spec["url"], connection_timeout=120.0, network_timeout=120.0
        )
        if rest
        else grpcclient.InferenceServerClient(spec["url"])
    )
    x = payload.x
    out_bytes = int(np.prod(payload.out_shape)) * 4
    tag = f"p{'r' if rest else 'b'}{os.getpid()}_{next(REGIONS)}"
    names = (f"{tag}_in", f"{tag}_out")
    regions = [
        shm.create_shared_memory_region(name, f"/{name}", size)
        for name, size in zip(names, (x.nbytes, out_bytes), strict=True)
    ]
    client.register_system_shared_memory(names[0], f"/{names[0]}", x.nbytes)
    client.register_system_shared_memory(names[1], f"/{names[1]}", out_bytes)

    def call() -> None:
        shm.set_shared_memory_region(regions[0], [x])
        value = module.InferInput(payload.input, list(x.shape), "FP32")
        value.set_shared_memory(names[0], x.nbytes)
        wanted = module.InferRequestedOutput(payload.output)
        wanted.set_shared_memory(names[1], out_bytes)
        client.infer(payload.model, [value], outputs=[wanted])
        payload.check(shm.get_contents_as_numpy(regions[1], np.float32, payload.out_shape))

    def close() -> None:
        for name in names:
            client.unregister_system_shared_memory(name)
        for region in regions:
            shm.destroy_shared_memory_region(region)
        client.close()

    return Closing(call, close)


def grps_rest(spec: dict[str, Any], payload: Payload) -> Call:
    """POST /grps/v1/infer/predict with a gtensors JSON body (orjson both ways)."""
    import requests

    session: Any = requests if spec.get("new_connection") else requests.Session()
    url = f"http://{spec['url']}/grps/v1/infer/predict"
    x = payload.x
    headers = {"Content-Type": "application/json"}

    def call() -> None:
        gtensor = {
            "name": payload.input,
            "dtype": "DT_FLOAT32",
            "shape": list(x.shape),
            "flat_float32": x.reshape(-1),
        }
        body = orjson.dumps(
            {"model": payload.model, "gtensors": {"tensors": [gtensor]}},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
        reply = session.post(url, data=body, headers=headers, timeout=120)
        reply.raise_for_status()
        payload.check(orjson.loads(reply.content)["gtensors"]["tensors"][0]["flat_float32"])

    return Closing(call, getattr(session, "close", _nothing))


def grps_grpc(spec: dict[str, Any], payload: Payload) -> Call:
    """GrpsService/Predict with one GenericTensor (stubs from protos/grps.proto)."""
    import grpc

    from appliance._generated import grps_pb2, grps_pb2_grpc

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    channel = grpc.insecure_channel(spec["url"], options=options)
    stub = grps_pb2_grpc.GrpsServiceStub(channel)
    x = payload.x

    def call() -> None:
        request = grps_pb2.GrpsMessage(model=payload.model)
        gtensor = request.gtensors.tensors.add(
            name=payload.input, dtype=grps_pb2.DT_FLOAT32, shape=x.shape
        )
        gtensor.flat_float32.extend(x.reshape(-1).tolist())
        reply = stub.Predict(request, timeout=120)
        if reply.status.code != 200:
            raise RuntimeError(f"GRPS status {reply.status.code}: {reply.status.msg}")
        payload.check(reply.gtensors.tensors[0].flat_float32)

    return Closing(call, channel.close)


def graphpipe(spec: dict[str, Any], payload: Payload) -> Call:
    """The stock client's request and reply codec, on a keep-alive session (or as
    its ``remote.execute`` sends: a bare ``requests.post``)."""
    import requests
    from graphpipe import convert

    session: Any = requests if spec.get("new_connection") else requests.Session()
    url = f"http://{spec['url']}/graphpipe/{payload.model}"
    x = payload.x

    def call() -> None:
        request = convert.InferReq(None, [x], [payload.input], [payload.output])
        reply = session.post(url, data=convert.serialize_infer_request(request), timeout=120)
        reply.raise_for_status()
        outputs, errors = convert.deserialize_infer_response(reply.content)
        if errors:
            raise RuntimeError(errors[0]["message"])
        payload.check(outputs[0])

    return Closing(call, getattr(session, "close", _nothing))


def _nothing() -> None:
    pass


def umbridge(spec: dict[str, Any], payload: Payload) -> Call:
    """POST /Evaluate with the input as one float64 vector, on a keep-alive session;
    with ``new_connection``, UM-Bridge's own client as users run it."""
    import requests

    if spec.get("new_connection"):
        return umbridge_model(spec, payload)
    session = requests.Session()
    url = f"http://{spec['url']}/Evaluate"
    x = payload.x

    def call() -> None:
        body = {"name": payload.model, "input": [x.reshape(-1).astype(np.float64)], "config": {}}
        data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        reply = session.post(url, data=data, timeout=120)
        reply.raise_for_status()
        payload.check(orjson.loads(reply.content)["output"][0])

    return Closing(call, session.close)


def umbridge_model(spec: dict[str, Any], payload: Payload) -> Call:
    """umbridge.HTTPModel: one ``requests.post`` (a new connection) per Evaluate."""
    import umbridge

    model = umbridge.HTTPModel(f"http://{spec['url']}", payload.model)
    x = [payload.x.reshape(-1).astype(np.float64).tolist()]

    def call() -> None:
        payload.check(model(x, {})[0])

    return call


def mip(spec: dict[str, Any], payload: Payload) -> Call:
    """One TENSOR item per request on a persistent connection (the listener's model)."""
    from appliance.protocols.mip.client import MipClient, decode_item, tensor_item

    client = MipClient(spec["host"], int(spec["port"]), timeout_s=120.0)
    item = tensor_item(payload.x.reshape(-1))

    def call() -> None:
        [[out]] = client.infer([[item]])
        payload.check(decode_item(out))

    return Closing(call, client.close)


def direct(spec: dict[str, Any], payload: Payload) -> Call:
    """The appliance's internal ModelClient: the floor under every protocol."""
    from appliance.client.api import ModelClient

    client = ModelClient.connect(Path(spec["run_dir"]), ring_bytes=4 << 20)
    inputs = {payload.input: payload.x}

    def call() -> None:
        with client.infer(payload.model, inputs) as result:
            payload.check(result.array(payload.output))

    return Closing(call, client.close)


BUILDERS: dict[str, Callable[[dict[str, Any], Payload], Call]] = {
    "kserve-grpc": kserve_grpc,
    "kserve-rest": kserve_rest,
    "kserve-shm": kserve_shm,
    "kserve-shm-rest": lambda spec, payload: kserve_shm(spec, payload, rest=True),
    "grps-rest": grps_rest,
    "grps-grpc": grps_grpc,
    "graphpipe": graphpipe,
    "umbridge": umbridge,
    "mip": mip,
    "direct": direct,
}
