"""A GraphPipe request encoder for tests, built on the generated builders.

The stock client cannot send Int8..Uint64 as it likes, Float16, named
empty or 0-d tensors, wrong types, bad shapes or short data; this can. The
tests here check that it writes what the stock client writes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flatbuffers
import numpy as np
import numpy.typing as npt

from appliance._generated.graphpipe import Error as fb_error
from appliance._generated.graphpipe import InferRequest as fb_infer_request
from appliance._generated.graphpipe import InferResponse as fb_infer_response
from appliance._generated.graphpipe import MetadataRequest as fb_metadata_request
from appliance._generated.graphpipe import MetadataResponse as fb_metadata_response
from appliance._generated.graphpipe import Request as fb_request
from appliance._generated.graphpipe import Tensor as fb_tensor

# SPEC: specs/graphpipe.md §3.1.1
NUMPY_BY_TYPE: dict[int, str] = {
    1: "<u1",
    2: "<i1",
    3: "<u2",
    4: "<i2",
    5: "<u4",
    6: "<i4",
    7: "<u8",
    8: "<i8",
    9: "<f2",
    10: "<f4",
    11: "<f8",
}
TYPE_BY_NUMPY = {np.dtype(name).str: number for number, name in NUMPY_BY_TYPE.items()}
STRING = 12


@dataclass
class WT:
    """A tensor as the wire carries it; any field may be wrong on purpose."""

    type: int
    shape: Sequence[int]
    data: bytes | None = None
    strings: Sequence[bytes] | None = None


def wire(array: Any) -> WT:
    """Return the wire form of an array (str/bytes elements become String)."""
    arr = np.asarray(array)
    if arr.dtype.kind in "OSU":
        elements = [e.encode() if isinstance(e, str) else bytes(e) for e in arr.reshape(-1)]
        return WT(STRING, arr.shape, strings=elements)
    little = arr.astype(arr.dtype.newbyteorder("<"))
    return WT(TYPE_BY_NUMPY[little.dtype.str], arr.shape, data=little.tobytes())


def _tensor(builder: flatbuffers.Builder, tensor: WT) -> int:
    fb_tensor.StartShapeVector(builder, len(tensor.shape))
    for dim in reversed(tensor.shape):
        builder.PrependInt64(int(dim))
    shape = builder.EndVector()
    strings = None
    if tensor.strings is not None:
        strings = _strings(builder, fb_tensor.StartStringValVector, tensor.strings)
    data = builder.CreateByteVector(tensor.data) if tensor.data is not None else None
    fb_tensor.Start(builder)
    fb_tensor.AddShape(builder, shape)
    fb_tensor.AddType(builder, tensor.type)
    if strings is not None:
        fb_tensor.AddStringVal(builder, strings)
    if data is not None:
        fb_tensor.AddData(builder, data)
    return int(fb_tensor.End(builder))


def _offsets(builder: flatbuffers.Builder, start: Any, offsets: list[int]) -> int:
    """Write a vector of offsets made last-first (as the stock client makes them)."""
    start(builder, len(offsets))
    for offset in offsets:
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())


def _strings(builder: flatbuffers.Builder, start: Any, texts: Sequence[str | bytes]) -> int:
    return _offsets(builder, start, [builder.CreateString(t) for t in reversed(texts)])


def encode_infer_request(
    tensors: Sequence[WT | Any],
    input_names: Sequence[str | bytes] = (),
    output_names: Sequence[str | bytes] = (),
    config: str | bytes = "",
) -> bytes:
    """Encode a Request holding an InferRequest, field order as the stock client."""
    builder = flatbuffers.Builder(1024)
    config_offset = builder.CreateString(config)
    offsets = [_tensor(builder, t if isinstance(t, WT) else wire(t)) for t in reversed(tensors)]
    inputs = _offsets(builder, fb_infer_request.StartInputTensorsVector, offsets)
    in_names = _strings(builder, fb_infer_request.StartInputNamesVector, input_names)
    out_names = _strings(builder, fb_infer_request.StartOutputNamesVector, output_names)
    fb_infer_request.Start(builder)
    fb_infer_request.AddConfig(builder, config_offset)
    fb_infer_request.AddInputTensors(builder, inputs)
    fb_infer_request.AddInputNames(builder, in_names)
    fb_infer_request.AddOutputNames(builder, out_names)
    return _finish_request(builder, 1, fb_infer_request.End(builder))


def encode_metadata_request(req_type: int = 2) -> bytes:
    """Encode a Request holding a MetadataRequest (or any union tag)."""
    builder = flatbuffers.Builder(64)
    fb_metadata_request.Start(builder)
    return _finish_request(builder, req_type, fb_metadata_request.End(builder))


def _finish_request(builder: flatbuffers.Builder, req_type: int, body: int) -> bytes:
    fb_request.Start(builder)
    fb_request.AddReqType(builder, req_type)
    fb_request.AddReq(builder, body)
    builder.Finish(fb_request.End(builder))
    return bytes(builder.Output())


def decode_infer_response(
    buf: bytes,
) -> tuple[list[tuple[int, npt.NDArray[Any]]], list[tuple[int, str]]]:
    """Return ([(type, array)], [(code, message)]) from an InferResponse."""
    response = fb_infer_response.InferResponse.GetRootAs(buf, 0)
    outputs = []
    for index in range(response.OutputTensorsLength()):
        tensor = response.OutputTensors(index)
        assert not tensor.ShapeIsNone(), "shape must always be written"
        shape = tuple(int(d) for d in tensor.ShapeAsNumpy())
        if tensor.Type() == STRING:
            strings = [tensor.StringVal(i) for i in range(tensor.StringValLength())]
            array = np.array(strings, dtype=object).reshape(shape)
        else:
            assert not tensor.DataIsNone(), "data must always be written"
            raw = bytes(tensor.DataAsNumpy())
            array = np.frombuffer(raw, NUMPY_BY_TYPE[tensor.Type()]).reshape(shape)
        outputs.append((tensor.Type(), array))
    errors: list[tuple[int, str]] = []
    for index in range(response.ErrorsLength()):
        error: fb_error.Error = response.Errors(index)
        errors.append((error.Code(), error.Message().decode()))
    return outputs, errors


def decode_metadata_response(buf: bytes) -> fb_metadata_response.MetadataResponse:
    return fb_metadata_response.MetadataResponse.GetRootAs(buf, 0)


# -- the encoder writes what the stock client writes ---------------------------


def _stock_request(arrays: list[Any], inputs: list[str], outputs: list[str]) -> bytes:
    from graphpipe import convert

    with warnings.catch_warnings():
        # graphpipe 1.0.4 passes EndVector(n), deprecated since flatbuffers 2.0.7.
        warnings.simplefilter("ignore", DeprecationWarning)
        request = convert.InferReq("", arrays, inputs, outputs)
        return bytes(convert.serialize_infer_request(request))


def test_same_bytes_as_the_stock_client_for_numbers_and_strings() -> None:
    arrays = [np.arange(6, dtype=np.float64).reshape(2, 3), np.array([b"ab", b""])]
    ours = encode_infer_request(arrays, ["a", "b"], ["c"])
    assert ours == _stock_request(arrays, ["a", "b"], ["c"])


def test_same_bytes_as_the_stock_client_for_a_metadata_request() -> None:
    # SPEC: PROTOCOL-FACTS §1.3 — the 32 bytes every client version sends.
    expected = bytes.fromhex("0c00000008000c000b000400080000000c000000000000020400040004000000")
    assert encode_metadata_request() == expected
