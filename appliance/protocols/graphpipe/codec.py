"""GraphPipe codec: flatbuffer bytes <-> requests, tensors and replies (pure).

Requests are read in one checked pass by :mod:`request`. Numeric tensor
data stays a (possibly unaligned) view over the body, and the model client
copies it once into an aligned ring slot. Replies are built with the
generated builders, except that each numeric tensor's data vector is only reserved in
the builder and its bytes are joined in when the reply is output: one copy
of each output tensor in all (see ``_byte_vector``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence

import numpy as np
from flatbuffers import Builder

from appliance._generated.graphpipe import Error as fb_error
from appliance._generated.graphpipe import InferResponse as fb_infer_response
from appliance._generated.graphpipe import IOMetadata as fb_io_metadata
from appliance._generated.graphpipe import MetadataResponse as fb_metadata_response
from appliance._generated.graphpipe import Tensor as fb_tensor
from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.protocols.graphpipe.errors import DecodeError, GraphPipeCode, GraphPipeError
from appliance.protocols.graphpipe.request import (
    InferRequest,
    MetadataRequest,
    WireTensor,
    read_request,
)
from appliance.protocols.graphpipe.wire import (
    DTYPE_BY_TYPE,
    TYPE_BY_DTYPE,
    TYPE_NAMES,
    IOInfo,
    MetadataInfo,
    new_builder,
)

# numpy refuses arrays whose element count times item size passes this,
# even when a zero dimension makes them empty.
_MAX_ELEMENTS = 1 << 62
_MAX_DIMS = 32
_LENGTH = struct.Struct("<I")


def decode_request(body: bytes) -> InferRequest | MetadataRequest:
    """Decode a POSTed flatbuffer ``Request`` (see :mod:`request`).

    Raises:
        DecodeError: the body is empty or not a well-formed Request.
    """
    if not body:
        raise DecodeError("empty body: POST a flatbuffer GraphPipe Request")
    return read_request(body)


def to_tensor(wire: WireTensor, what: str) -> Tensor:
    """Check a wire tensor and return it as an appliance Tensor.

    Numeric data is a (possibly unaligned) view over the request body; String
    elements are packed into the BYTES layout.

    Raises:
        GraphPipeError: unknown type, bad shape, or a data length that does
            not match the shape.
    """
    dtype = DTYPE_BY_TYPE.get(wire.type)
    if dtype is None:
        raise GraphPipeError(
            GraphPipeCode.UNSUPPORTED_TYPE,
            f"{what}: type {wire.type} is not a GraphPipe tensor type "
            f"(1..12: {', '.join(TYPE_NAMES.values())})",
        )
    count = _element_count(wire.shape, dtypes.item_size(dtype), what)
    if dtype is DType.BYTES:
        return _bytes_tensor(wire, count, what)
    itemsize = dtypes.item_size(dtype)
    data = wire.data if wire.data is not None else np.empty(0, np.uint8)
    if wire.strings or data.size != count * itemsize:
        extra = f" and {len(wire.strings)} string_val elements" if wire.strings else ""
        raise GraphPipeError(
            GraphPipeCode.DATA_LENGTH,
            f"{what}: shape {list(wire.shape)} of {TYPE_NAMES[wire.type]} needs "
            f"{count * itemsize} data bytes, got {data.size}{extra}",
        )
    return Tensor(dtype, wire.shape, data.view(dtypes.to_numpy(dtype)).reshape(wire.shape))


def _element_count(shape: tuple[int, ...], itemsize: int, what: str) -> int:
    if len(shape) > _MAX_DIMS:
        raise GraphPipeError(
            GraphPipeCode.BAD_SHAPE, f"{what}: {len(shape)} dimensions, at most {_MAX_DIMS}"
        )
    if any(dim < 0 for dim in shape):
        raise GraphPipeError(
            GraphPipeCode.BAD_SHAPE, f"{what}: shape {list(shape)} has a negative dimension"
        )
    if math.prod(max(dim, 1) for dim in shape) * max(itemsize, 1) > _MAX_ELEMENTS:
        raise GraphPipeError(GraphPipeCode.BAD_SHAPE, f"{what}: shape {list(shape)} is too big")
    return math.prod(shape)


def _bytes_tensor(wire: WireTensor, count: int, what: str) -> Tensor:
    strings = wire.strings or []
    if len(strings) != count or (wire.data is not None and wire.data.size):
        extra = f" and {wire.data.size} data bytes" if wire.data is not None else ""
        raise GraphPipeError(
            GraphPipeCode.DATA_LENGTH,
            f"{what}: shape {list(wire.shape)} of String needs {count} string_val elements "
            f"and no data, got {len(strings)}{extra}",
        )
    packed = b"".join(part for s in strings for part in (_LENGTH.pack(len(s)), s))
    return Tensor(DType.BYTES, wire.shape, packed)


# -- replies -------------------------------------------------------------------


def encode_infer_response(outputs: Sequence[Tensor]) -> bytes:
    """Encode output tensors as an ``InferResponse`` root table.

    SPEC: PROTOCOL-FACTS §1.3 — the Python client reads ``shape`` and
    ``data`` unconditionally, so both are always written (``string_val``
    instead of ``data`` for String tensors), even when empty.
    """
    builder = new_builder(sum(_reply_size(tensor) for tensor in outputs))
    splices: list[_Splice] = []
    offsets = [_encode_tensor(builder, tensor, splices) for tensor in outputs]
    fb_infer_response.StartOutputTensorsVector(builder, len(offsets))
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    vector = builder.EndVector()
    fb_infer_response.Start(builder)
    fb_infer_response.AddOutputTensors(builder, vector)
    builder.Finish(fb_infer_response.End(builder))
    return _output(builder, splices)


def encode_error_response(error: GraphPipeError) -> bytes:
    """Encode one error as an ``InferResponse`` with ``errors`` only."""
    builder = new_builder(len(error.message) * 4)
    message = builder.CreateString(error.message)
    fb_error.Start(builder)
    fb_error.AddCode(builder, int(error.code))
    fb_error.AddMessage(builder, message)
    entry = fb_error.End(builder)
    fb_infer_response.StartErrorsVector(builder, 1)
    builder.PrependUOffsetTRelative(entry)
    errors = builder.EndVector()
    fb_infer_response.Start(builder)
    fb_infer_response.AddErrors(builder, errors)
    builder.Finish(fb_infer_response.End(builder))
    return _output(builder)


# A data vector's bytes, left out of the builder: (its distance from the end
# of the builder's buffer, which growing the buffer does not change; the bytes).
_Splice = tuple[int, memoryview]


def _reply_size(tensor: Tensor) -> int:
    if tensor.dtype is DType.BYTES:
        return len(tensor.packed()) + 8 * tensor.element_count + 64
    return tensor.nbytes + 8 * len(tensor.shape) + 64


def _encode_tensor(builder: Builder, tensor: Tensor, splices: list[_Splice]) -> int:
    shape = _int64_vector(builder, fb_tensor.StartShapeVector, tensor.shape)
    if tensor.dtype is DType.BYTES:
        elements = [builder.CreateString(dtypes.as_bytes(e)) for e in tensor.array().reshape(-1)]
        fb_tensor.StartStringValVector(builder, len(elements))
        for element in reversed(elements):
            builder.PrependUOffsetTRelative(element)
        values = builder.EndVector()
    else:
        values = _byte_vector(builder, tensor.raw(), splices)
    fb_tensor.Start(builder)
    fb_tensor.AddType(builder, TYPE_BY_DTYPE[tensor.dtype])
    fb_tensor.AddShape(builder, shape)
    if tensor.dtype is DType.BYTES:
        fb_tensor.AddStringVal(builder, values)
    else:
        fb_tensor.AddData(builder, values)
    offset: int = fb_tensor.End(builder)
    return offset


def _byte_vector(builder: Builder, raw: memoryview, splices: list[_Splice]) -> int:
    """Reserve a ``[uint8]`` vector for ``raw`` and leave its bytes to :func:`_output`.

    PERF: the generated API (``CreateNumpyVector`` copies through
    ``tobytes``, then into the builder, then out) took 13-20x longer than
    this for a 16 MiB reply, and this takes 0.9-1.2x one memcpy of the tensor
    (bench/bench_graphpipe.py). The reserved space is never written, so its
    (mmap) pages are never touched, and the tensor is copied once, when the
    reply is joined.
    """
    fb_tensor.StartDataVector(builder, len(raw))
    builder.head = builder.head - len(raw)
    splices.append((builder.Offset(), raw))
    offset: int = builder.EndVector()
    return offset


def _int64_vector(
    builder: Builder, start: Callable[[Builder, int], int], values: Sequence[int]
) -> int:
    start(builder, len(values))
    for value in reversed(values):
        builder.PrependInt64(int(value))
    offset: int = builder.EndVector()
    return offset


def _output(builder: Builder, splices: Sequence[_Splice] = ()) -> bytes:
    """Return the finished buffer as bytes, with the reserved data spliced in."""
    buffer = memoryview(builder.Bytes)
    parts: list[memoryview] = []
    position = builder.Head()
    # Vectors reserved later lie nearer the start of the buffer.
    for from_end, raw in reversed(splices):
        start = len(buffer) - from_end
        parts += (buffer[position:start], raw)
        position = start + len(raw)
    parts.append(buffer[position:])
    # One copy; WSGI servers want bytes, not bytearray.
    return b"".join(parts)


# -- metadata ------------------------------------------------------------------


def encode_metadata_response(info: MetadataInfo) -> bytes:
    """Encode a ``MetadataResponse`` root table (inputs/outputs always present)."""
    builder = new_builder(4096)
    name, version, server, description = (
        builder.CreateString(text)
        for text in (info.name, info.version, info.server, info.description)
    )
    vectors = []
    for ios, start in (
        (info.inputs, fb_metadata_response.StartInputsVector),
        (info.outputs, fb_metadata_response.StartOutputsVector),
    ):
        offsets = [_encode_io(builder, io) for io in ios]
        start(builder, len(offsets))
        for offset in reversed(offsets):
            builder.PrependUOffsetTRelative(offset)
        vectors.append(builder.EndVector())
    fb_metadata_response.Start(builder)
    fb_metadata_response.AddName(builder, name)
    fb_metadata_response.AddVersion(builder, version)
    fb_metadata_response.AddServer(builder, server)
    fb_metadata_response.AddDescription(builder, description)
    fb_metadata_response.AddInputs(builder, vectors[0])
    fb_metadata_response.AddOutputs(builder, vectors[1])
    builder.Finish(fb_metadata_response.End(builder))
    return _output(builder)


def _encode_io(builder: Builder, io: IOInfo) -> int:
    name = builder.CreateString(io.name)
    description = builder.CreateString(io.description)
    shape = _int64_vector(builder, fb_io_metadata.StartShapeVector, io.shape)
    fb_io_metadata.Start(builder)
    fb_io_metadata.AddName(builder, name)
    fb_io_metadata.AddDescription(builder, description)
    fb_io_metadata.AddShape(builder, shape)
    fb_io_metadata.AddType(builder, io.type)
    offset: int = fb_io_metadata.End(builder)
    return offset
