"""Fuzz targets: one per codec, each a function of untrusted bytes.

A target decodes its input as that protocol's server does, goes on as far as
the model client would (binding to a model's declared inputs, building the
tensors a worker unpacks) and returns. It swallows only the protocol's own
decode error (and the ValueError a worker turns into BadRequest when it
unpacks BYTES); anything else escapes, and the fuzzer reports it. Memory and
time are bounded by the runner (tools/fuzz/run.py) and by the unit tests
(tests/unit/test_fuzz_harness.py), not here.

Imports are inside the targets: ``kserve_grpc`` defines the ``inference.*``
protobuf names, which clash with tritonclient's in one process, so it runs
in a process of its own and its seeds are made in another.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tools.fuzz import regions, seeds

Run = Callable[[bytes], None]


@dataclass(frozen=True)
class Target:
    """A codec under fuzzing: what to call, and where its seed inputs come from."""

    name: str
    run: Run
    seeds: Callable[[], list[bytes]]
    # Tokens worth splicing into inputs (a libFuzzer dictionary).
    words: tuple[str, ...] = ()


def _quoted(*words: str) -> tuple[str, ...]:
    return tuple(f'"{word}"' for word in words)


_KSERVE_WORDS = _quoted(
    *("inputs", "outputs", "name", "datatype", "shape", "data", "parameters", "id"),
    *("binary_data_size", "binary_data", "binary_data_output", "timeout", "classification"),
    *("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"),
    *("BOOL", "UINT8", "UINT64", "INT8", "INT64", "FP16", "FP32", "FP64", "BYTES"),
)
_GRPS_WORDS = _quoted(
    *("model", "str_data", "bin_data", "gtensors", "tensors", "ndarray", "gmap", "dtype"),
    *("shape", "flat_uint8", "flat_int8", "flat_int64", "flat_float16", "flat_double"),
    *("flat_string", "DT_STRING", "DT_INT64", "DT_FLOAT16", "s_s", "s_b", "s_i64", "s_d"),
)
_UMBRIDGE_WORDS = _quoted(
    *("name", "input", "config", "outWrt", "inWrt", "inWrt1", "inWrt2", "sens", "vec"),
)
_DESCRIPTOR_WORDS = _quoted("tensors", "inline", "blocks", "FP32", "BYTES", "message")


def _materialize(tensors: Iterable[Any]) -> None:
    """Do to decoded tensors what the client and the worker do: raw bytes, then arrays."""
    for tensor in tensors:
        tensor.raw()
        # Packed BYTES that do not fit the shape: the worker's BadRequest.
        with contextlib.suppress(ValueError):
            tensor.array()


# -- KServe --------------------------------------------------------------------


def kserve_rest(data: bytes) -> None:
    """Byte 0: bit 0 = a 4-byte header length follows, bit 1 = the body is deflated."""
    from appliance.errors import TooLarge
    from appliance.protocols.kserve import codec, encoding
    from appliance.protocols.kserve.errors import DecodeError

    mode, body = (data[0], data[1:]) if data else (0, b"")
    header_length = None
    if mode & 1 and len(body) >= 4:
        (header_length,) = struct.unpack_from("!I", body)
        body = body[4:]
    try:
        if mode & 2:
            body = encoding.decode_content(body, "deflate", 1 << 20)
        request = codec.decode_infer_request(body, header_length, "m")
        request.timeout_s()
        request.model_parameters()
    except (DecodeError, TooLarge):
        return
    _materialize(item.data for item in request.inputs if item.data is not None)


def kserve_grpc(data: bytes) -> None:
    """A serialized ModelInferRequest (grpcio hands over only parseable ones)."""
    from google.protobuf.message import DecodeError as ProtobufError

    from appliance.protocols.kserve import pbcodec
    from appliance.protocols.kserve.errors import DecodeError

    try:
        message = pbcodec.pb.ModelInferRequest.FromString(data)
    except ProtobufError:
        return
    try:
        request = pbcodec.decode_infer_request(message)
        request.timeout_s()
    except DecodeError:
        return
    _materialize(item.data for item in request.inputs if item.data is not None)


# -- GRPS ------------------------------------------------------------------------


def _grps_bind(payload: Any) -> None:
    from appliance.protocols.grps.bind import bind
    from appliance.protocols.grps.errors import GrpsError

    for metadata in seeds.models():
        try:
            _materialize(bind(payload, metadata).values())
        except GrpsError:
            continue


def grps_json(data: bytes) -> None:
    from appliance.protocols.grps import codec
    from appliance.protocols.grps.errors import GrpsError

    try:
        payload = codec.decode_json_request(data)
    except GrpsError:
        return
    _grps_bind(payload)


def grps_pb(data: bytes) -> None:
    from google.protobuf.message import DecodeError as ProtobufError

    from appliance.protocols.grps import pbcodec
    from appliance.protocols.grps.errors import GrpsError

    try:
        message = pbcodec.GrpsMessage.FromString(data)
    except ProtobufError:
        return
    try:
        payload = pbcodec.decode_message(message)
    except GrpsError:
        return
    _grps_bind(payload)


# -- GraphPipe -------------------------------------------------------------------


def graphpipe(data: bytes) -> None:
    from appliance.protocols.graphpipe import codec
    from appliance.protocols.graphpipe.bind import bind
    from appliance.protocols.graphpipe.errors import DecodeError, GraphPipeError

    try:
        request = codec.decode_request(data)
    except DecodeError:
        return
    if not isinstance(request, codec.InferRequest):
        return
    for metadata in seeds.models():
        try:
            _materialize(bind(metadata, request).inputs.values())
        except GraphPipeError:
            continue


# -- MIP ---------------------------------------------------------------------------


def mip(data: bytes) -> None:
    """A byte stream on one connection, fed in chunks of sizes taken from byte 0."""
    from appliance.protocols.mip import codec

    reader = codec.FrameReader(1 << 20)
    step = (data[0] if data else 0) + 1
    for start in range(1, len(data), step):
        reader.feed(data[start : start + step])
        while (event := reader.next_event()) is not None:
            if isinstance(event, codec.Frame):
                _mip_frame(event)


def _mip_frame(frame: Any) -> None:
    from appliance.protocols.mip import batch, codec

    if codec.check_request(frame.header) is not None:
        return
    if frame.header.kind != codec.Kind.INFERENCE:
        return
    try:
        request = codec.decode_infer_request(frame.payload)
    except codec.MipError:
        return
    for metadata in seeds.models():
        try:
            batch.plan(batch.bind(metadata, request.n_input), request)
        except codec.MipError:
            continue


def mip_item(data: bytes) -> None:
    """Byte 0 picks the item type; the rest is the item's data, tried on every input."""
    from appliance.protocols.mip import codec, items

    item_type = codec.ItemType((data[0] % 4) + 1) if data else codec.ItemType.TEXT
    item = codec.Item(item_type, memoryview(data[1:]))
    for metadata in seeds.models():
        for spec in metadata.inputs or (None,):
            shape = () if spec is None else spec.shape[1:]
            try:
                items.decode_row(item, spec, shape, "fuzz")
            except codec.MipError:
                continue


# -- UM-Bridge ----------------------------------------------------------------------


def umbridge(data: bytes) -> None:
    from appliance.protocols.umbridge import codec
    from appliance.protocols.umbridge.bridge import read_wrt
    from appliance.protocols.umbridge.errors import UmBridgeError

    try:
        request = codec.decode_body(data)
        codec.read_name(request)
        codec.read_config(request)
    except UmBridgeError:
        return
    for metadata in seeds.umbridge_models():
        iface = codec.interface_of(metadata)
        with contextlib.suppress(UmBridgeError):
            codec.to_model_inputs(iface, codec.read_inputs(request, iface))
        for feature in codec.Feature:
            with contextlib.suppress(UmBridgeError):
                read_wrt(request, iface, feature)


# -- descriptors (ZeroMQ, between the appliance's own processes) --------------------


def descriptor(data: bytes) -> None:
    from appliance.core import descriptor as d
    from appliance.core.message_tensors import read_tensors
    from appliance.errors import BadRequest

    try:
        message = d.from_frame(data)
    except d.DescriptorError:
        return
    entries = message.body.get("tensors")
    if not isinstance(entries, list):
        return
    try:
        tensors = read_tensors(entries, message.payloads, seeds.NoSegments())
    except BadRequest:
        return
    _materialize(tensors.values())


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target("kserve_rest", kserve_rest, seeds.kserve_rest, _KSERVE_WORDS),
        Target("kserve_grpc", kserve_grpc, seeds.kserve_grpc),
        Target("grps_json", grps_json, seeds.grps_json, _GRPS_WORDS),
        Target("grps_pb", grps_pb, seeds.grps_pb),
        Target("graphpipe", graphpipe, seeds.graphpipe),
        Target("mip", mip, seeds.mip),
        Target("mip_item", mip_item, seeds.mip_item),
        Target("umbridge", umbridge, seeds.umbridge, _UMBRIDGE_WORDS),
        Target("descriptor", descriptor, seeds.descriptor, _DESCRIPTOR_WORDS),
        # Not a codec: a client's shared memory, shrunk, replaced or unregistered under use.
        Target("client_memory", regions.run, regions.seeds),
    )
}
# Targets that must not share a process with tritonclient.
ISOLATED = frozenset({"kserve_grpc"})
