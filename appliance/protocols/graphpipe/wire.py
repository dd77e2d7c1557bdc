"""GraphPipe's type table and metadata, shared by the codec and the bindings.

SPEC: specs/graphpipe.md §3.1.1 (types) and §3.3.2 (metadata);
PROTOCOL-FACTS §1.2 for the JSON a GET answers, shaped like the Go
reference's ``NativeMetadataResponse`` (CamelCase keys, 4-space indent).
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass

from flatbuffers import Builder

from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import TensorSpec

SERVER_NAME = "appliance"
_MMAP_BUILDER_BYTES = 1 << 20
# Inputs of a model that declares none (echo) are named by position.
POSITIONAL_INPUT = "input{index}"

# SPEC: specs/graphpipe.md §3.1.1 — the Type enum (Null = 0 is no type).
TYPE_NAMES: dict[int, str] = {
    1: "Uint8",
    2: "Int8",
    3: "Uint16",
    4: "Int16",
    5: "Uint32",
    6: "Int32",
    7: "Uint64",
    8: "Int64",
    9: "Float16",
    10: "Float32",
    11: "Float64",
    12: "String",
}
DTYPE_BY_TYPE: dict[int, DType] = {
    1: DType.UINT8,
    2: DType.INT8,
    3: DType.UINT16,
    4: DType.INT16,
    5: DType.UINT32,
    6: DType.INT32,
    7: DType.UINT64,
    8: DType.INT64,
    9: DType.FP16,
    10: DType.FP32,
    11: DType.FP64,
    12: DType.BYTES,
}
TYPE_BY_DTYPE: dict[DType, int] = {dtype: number for number, dtype in DTYPE_BY_TYPE.items()}
# SPEC: GraphPipe has no Bool type. A BOOL tensor travels as Uint8 holding
# 0 or 1 (numpy's bool bytes), both in replies and in metadata; a BOOL input
# accepts any integer tensor holding only 0 and 1 (see bind.py).
TYPE_BY_DTYPE[DType.BOOL] = 1


def type_name(dtype: DType) -> str:
    return TYPE_NAMES[TYPE_BY_DTYPE[dtype]]


@dataclass(frozen=True, slots=True)
class IOInfo:
    """One input or output as GraphPipe describes it (shape -1 = any size)."""

    name: str
    description: str
    shape: tuple[int, ...]
    type: int


@dataclass(frozen=True, slots=True)
class MetadataInfo:
    """What a MetadataResponse (or a GET) tells about one model."""

    name: str
    version: str
    server: str
    description: str
    inputs: tuple[IOInfo, ...]
    outputs: tuple[IOInfo, ...]


def describe(metadata: ModelMetadata) -> MetadataInfo:
    """Describe a model as GraphPipe metadata.

    A generic model (declared inputs/outputs None, such as echo) has empty
    input and output lists; its description says how to call it.
    """
    description = metadata.description or f"{metadata.platform} model {metadata.name}"
    if metadata.inputs is None or metadata.outputs is None:
        description = (
            f"{description.rstrip('.')}. Generic: it declares no inputs or outputs and "
            f"accepts any tensors (unnamed inputs are called {POSITIONAL_INPUT.format(index=0)}, "
            f"{POSITIONAL_INPUT.format(index=1)}, ...)."
        )
    return MetadataInfo(
        name=metadata.name,
        version=metadata.versions[-1] if metadata.versions else "",
        server=SERVER_NAME,
        description=description,
        inputs=tuple(_io(spec) for spec in metadata.inputs or ()),
        outputs=tuple(_io(spec) for spec in metadata.outputs or ()),
    )


def _io(spec: TensorSpec) -> IOInfo:
    note = "BOOL, sent as Uint8 0 or 1" if spec.dtype is DType.BOOL else ""
    return IOInfo(spec.name, note, spec.shape, TYPE_BY_DTYPE[spec.dtype])


def metadata_json(info: MetadataInfo) -> bytes:
    """Return the JSON a GET answers, keyed like the Go reference server."""
    document = {
        "Name": info.name,
        "Version": info.version,
        "Server": info.server,
        "Description": info.description,
        "Inputs": [_io_json(io) for io in info.inputs],
        "Outputs": [_io_json(io) for io in info.outputs],
    }
    return json.dumps(document, indent=4).encode()


def _io_json(io: IOInfo) -> dict[str, object]:
    return {
        "Name": io.name,
        "Description": io.description,
        "Shape": list(io.shape),
        "Type": io.type,
    }


def new_builder(payload_bytes: int) -> Builder:
    """Return a builder sized for the payload, so it never grows (and copies).

    A reply past flatbuffers' 2 GiB limit fails later, when the builder
    cannot grow (``BuilderSizeError``).

    PERF: ``Builder(n)`` zero-fills a bytearray of n bytes, touching every
    page; for a 16 MiB reply that cost more than the copy of the tensor.
    Large builders get anonymous mmap memory instead, which the kernel
    zeroes lazily: the data vectors the codec reserves but never writes
    (see ``codec._byte_vector``) are then never touched at all.
    """
    size = min(payload_bytes + 1024, Builder.MAX_BUFFER_SIZE)
    if size < _MMAP_BUILDER_BYTES:
        return Builder(size)
    builder = Builder(0)
    builder.Bytes = mmap.mmap(-1, size)
    builder.head = size
    return builder
