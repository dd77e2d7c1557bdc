"""Seed inputs for the fuzz targets: real messages, built as stock clients build them.

KServe requests come from tritonclient's own request builders, GraphPipe's
from the stock ``graphpipe`` client, MIP's from KubeMo's wire layout (the
capture of PROTOCOL-FACTS §4.2) and our TENSOR items, UM-Bridge's and GRPS's
from the bodies their clients and documentation send. Each seed is in its
target's input format (see tools/fuzz/targets.py).
"""

from __future__ import annotations

import functools
import io
import struct
import warnings
import zlib
from typing import Any

import numpy as np
import orjson


def _model(name: str, inputs: Any, outputs: Any = (), batch: int = 8) -> Any:
    """A model's metadata; its outputs are like its inputs unless given."""
    from appliance.core.metadata import ModelMetadata

    return ModelMetadata(
        name=name,
        versions=("1",),
        platform="python",
        inputs=None if inputs is None else tuple(inputs),
        outputs=None if inputs is None else tuple(outputs or inputs),
        max_batch_size=batch,
        supports={"predict": True, "gradient": True, "apply_jacobian": True, "apply_hessian": True},
    )


@functools.cache
def models() -> tuple[Any, ...]:
    """The demo models' interfaces, and an image-like one for MIP's IMAGE items.

    Built on first use, so that a fuzzer instruments the appliance modules it imports.
    """
    from appliance.core.tensor import spec

    return (
        _model("echo", None, batch=0),
        _model("simple", [spec("INPUT0", "INT32", [-1, 16]), spec("INPUT1", "INT32", [-1, 16])]),
        _model(
            "simple_string", [spec("INPUT0", "BYTES", [-1, 16]), spec("INPUT1", "BYTES", [-1, 16])]
        ),
        _model("digits", [spec("pixels", "FP32", [-1, 64])], [spec("probs", "FP32", [-1, 10])]),
        _model("flags", [spec("b", "BOOL", [-1, 2]), spec("u", "UINT64", [-1])]),
        _model("picture", [spec("image", "UINT8", [-1, 8, 8, 3])]),
    )


@functools.cache
def umbridge_models() -> tuple[Any, ...]:
    from appliance.core.tensor import spec

    return (
        _model("forward", [spec("x", "FP64", [-1, 1])], [spec("y", "FP64", [-1, 1])], 64),
        _model("rosenbrock", [spec("x", "FP64", [-1, 2])], [spec("f", "FP64", [-1, 1])], 64),
        models()[1],
    )


class NoSegments:
    """A SegmentReader with no segments: ring places name segments that are gone."""

    def view(self, segment: str, offset: int, nbytes: int) -> memoryview:
        raise FileNotFoundError(segment)


def _arrays() -> list[np.ndarray[Any, Any]]:
    return [
        np.arange(16, dtype=np.int32).reshape(1, 16),
        np.array([[1.5, -2.0]], dtype=np.float64),
        np.array([b"one", b"", b"t\x00o"], dtype=object),
        np.zeros((2, 0), dtype=np.float32),
        np.array(7, dtype=np.uint8),
    ]


def kserve_rest() -> list[bytes]:
    import tritonclient.http as httpclient
    from tritonclient.http._utils import _get_inference_request

    out = []
    for binary in (True, False):
        inputs = []
        for index, array in enumerate(_arrays()):
            datatype = (
                "BYTES" if array.dtype == object else httpclient.np_to_triton_dtype(array.dtype)
            )
            infer_input = httpclient.InferInput(f"in{index}", list(array.shape), datatype)
            infer_input.set_data_from_numpy(array, binary_data=binary)
            inputs.append(infer_input)
        outputs = [httpclient.InferRequestedOutput("out", binary_data=binary)]
        body, json_size = _get_inference_request(
            inputs, "id-1", outputs, 0, False, False, 0, 1000, {"k": "v"}
        )
        if json_size is None:
            out.append(b"\x00" + body)
        else:
            out.append(b"\x01" + struct.pack("!I", json_size) + body)
            out.append(b"\x03" + struct.pack("!I", json_size) + zlib.compress(body))
    return out


def kserve_grpc() -> list[bytes]:
    """Serialized ModelInferRequests (call in a process that never imports pbcodec)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    inputs = []
    for index, array in enumerate(_arrays()):
        datatype = "BYTES" if array.dtype == object else grpcclient.np_to_triton_dtype(array.dtype)
        infer_input = grpcclient.InferInput(f"in{index}", list(array.shape), datatype)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    outputs = [grpcclient.InferRequestedOutput("out")]
    request = _get_inference_request(
        "simple", inputs, "1", "id-1", outputs, 0, False, False, 0, 1000, {"k": 1.5}
    )
    typed = _get_inference_request("simple", inputs[:1], "", "", None, 0, False, False, 0, None, {})
    typed.raw_input_contents.pop()
    typed.inputs[0].contents.int_contents.extend(range(16))
    return [request.SerializeToString(), typed.SerializeToString()]


def grps_json() -> list[bytes]:
    docs: list[Any] = [
        {"str_data": "hello", "model": "echo"},
        {"bin_data": "AP8="},
        {"ndarray": [[1.0, 2.0], [3.0, 4.0]]},
        {"gmap": {"s_s": {"a": "b"}, "s_i64": {"n": "7"}, "s_f": {"x": 1.5}}},
        {
            "gtensors": {
                "tensors": [
                    {"name": "in1", "dtype": "DT_INT32", "shape": [3, 2], "flat_int32": [1] * 6},
                    {"name": "in2", "dtype": "DT_FLOAT64", "shape": [1], "flat_double": [1.0]},
                    {"dtype": "DT_STRING", "flat_string": ["a", ""]},
                    {"dtype": "DT_INT64", "flat_int64": ["9007199254740993", 2]},
                ]
            }
        },
    ]
    return [orjson.dumps(doc) for doc in docs]


def grps_pb() -> list[bytes]:
    from appliance.protocols.grps import pbcodec

    pb = pbcodec.grps_pb2
    messages = [pb.GrpsMessage(str_data="hello"), pb.GrpsMessage(bin_data=b"\x00\xff")]
    tensors = pb.GrpsMessage(model="simple")
    tensors.gtensors.tensors.add(
        name="INPUT0", dtype=pb.DT_INT32, shape=[1, 16], flat_int32=[1] * 16
    )
    tensors.gtensors.tensors.add(dtype=pb.DT_FLOAT32, shape=[2], flat_float32=[1.5, 2.5])
    tensors.gtensors.tensors.add(dtype=pb.DT_STRING, flat_string=["x"])
    messages.append(tensors)
    gmap = pb.GrpsMessage()
    gmap.gmap.s_s["a"] = "b"
    gmap.gmap.s_i32["n"] = 3
    messages.append(gmap)
    return [message.SerializeToString() for message in messages]


def graphpipe() -> list[bytes]:
    from graphpipe import convert

    arrays = [np.arange(16, dtype=np.int32).reshape(1, 16), np.array([[1.5] * 64], np.float32)]
    requests = [
        convert.InferReq(None, arrays, None, None),
        convert.InferReq('{"k": 1}', arrays[:1], ["INPUT0"], ["OUTPUT0"]),
        convert.InferReq("", [np.array([b"ab", b""], dtype=object)], ["INPUT0"], None),
    ]
    with warnings.catch_warnings():
        # flatbuffers deprecates an API the stock client still calls.
        warnings.simplefilter("ignore", DeprecationWarning)
        out = [bytes(convert.serialize_infer_request(request)) for request in requests]
        return [*out, bytes(convert.serialize_metadata_request())]


# SPEC: PROTOCOL-FACTS §4.2 — a KubeMo client's request (JSON + TEXT, batch of 2).
_KUBEMO_PAYLOAD = (
    bytes.fromhex("02000002")
    + bytes.fromhex("000000020000000f")
    + b"[0.0, 1.0, 2.0]"
    + bytes.fromhex("0000000100000002")
    + b"hi"
    + bytes.fromhex("000000020000000f")
    + b"[3.0, 4.0, 5.0]"
    + bytes.fromhex("0000000100000002")
    + b"yo"
)
KUBEMO_REQUEST = bytes.fromhex("00020000") + struct.pack("!L", 70) + _KUBEMO_PAYLOAD


def mip() -> list[bytes]:
    from appliance.protocols.mip.client import encode_request, json_item, tensor_item, text_item

    frames = [
        KUBEMO_REQUEST,
        bytes([0, 1, 0, 0, 0, 0, 0, 0]),  # ping
        encode_request([[tensor_item(np.arange(16, dtype=np.int32))] * 2]),
        encode_request([[text_item("[1, 2]"), json_item([[b"x".decode()]])]]),
        encode_request([[(3, _png())]]),
    ]
    # Byte 0 is the chunk size the stream is fed in.
    return [bytes([step]) + b"".join(frames) for step in (0, 7, 255)]


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()


def mip_item() -> list[bytes]:
    from appliance.protocols.mip import items

    tensor = b"".join(items.encode_tensor(np.arange(16, dtype=np.int32)))
    strings = b"".join(items.encode_tensor(np.array([b"a", b"bc"], dtype=object)))
    # Byte 0 picks the type: 0 TEXT, 1 JSON, 2 IMAGE, 3 TENSOR.
    return [
        b"\x00[1, 2.5]",
        b"\x01[[1, 2], [3, 4]]",
        b'\x01["a", "b"]',
        b"\x02" + _png(),
        b"\x03" + tensor,
        b"\x03" + strings,
    ]


def umbridge() -> list[bytes]:
    docs: list[Any] = [
        {"name": "forward", "input": [[0.5]], "config": {}},
        {"name": "rosenbrock", "input": [[1.0, 2.0]], "config": {"k": 1}},
        {"name": "forward", "outWrt": 0, "inWrt": 0, "input": [[1.0]], "sens": [1.0], "config": {}},
        {
            "name": "rosenbrock",
            "outWrt": 0,
            "inWrt1": 0,
            "inWrt2": 0,
            "input": [[1.0, 2.0]],
            "sens": [1.0],
            "vec": [1.0, 0.0],
            "config": {},
        },
        {"name": "forward"},
    ]
    return [orjson.dumps(doc) for doc in docs]


def descriptor() -> list[bytes]:
    from appliance.core import descriptor as d
    from appliance.core.tensor import Tensor

    tensors = {"x": np.arange(4, dtype=np.float32), "s": np.array([b"ab"], dtype=object)}
    payloads: list[Any] = [Tensor.from_array(a).raw() for a in tensors.values()]
    entries = [
        ["x", "FP32", [4], 0],
        ["s", "BYTES", [1], 1],
        ["r", "FP64", [2], ["appliance-0-ring", 0, 16]],
    ]
    body = {"model": "m", "method": "predict", "params": {}, "tensors": entries}
    return [
        d.to_frame(d.Message(d.Kind.INFER, 1, 2, body, payloads, deadline=1.5)),
        d.to_frame(d.Message(d.Kind.RELEASE, 1, 2, {"blocks": [["seg", 0, 64]]})),
    ]
