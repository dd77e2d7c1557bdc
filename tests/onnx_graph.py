"""Write small ONNX models for tests, with no onnx package.

The onnx package is not among the appliance's dependencies (ONNX Runtime
is), so a test that needs a model of its own encodes the ModelProto itself:
the few messages and fields below (onnx/onnx.proto's numbers) in
protobuf's wire format. Enough for a graph of plain operators over named
inputs, outputs and constant initializers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

# onnx.TensorProto.DataType, by numpy type, or by the appliance's name for
# the types numpy has no dtype of its own for.
ELEMENT_TYPES: dict[np.dtype[np.generic] | str, int] = {
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float64): 11,
    np.dtype(np.uint32): 12,
    np.dtype(np.uint64): 13,
    "BYTES": 8,
    "FP16": 10,
    "BF16": 16,
}
_NAMED = {"FP32": np.float32, "UINT8": np.uint8, "INT64": np.int64, "BOOL": np.bool_}
IR_VERSION = 8
OPSET = 17


@dataclass
class Graph:
    """A graph under construction: ``tensor`` declares inputs/outputs, ``node`` adds ops."""

    name: str
    inputs: list[bytes] = field(default_factory=list)
    outputs: list[bytes] = field(default_factory=list)
    nodes: list[bytes] = field(default_factory=list)
    constants: list[bytes] = field(default_factory=list)

    def input(self, name: str, dtype: type | str, shape: Sequence[int | str]) -> None:
        """Declare an input; a dim is a size, a symbol (str) or -1 (unknown)."""
        self.inputs.append(_value_info(name, _element(dtype), shape))

    def output(self, name: str, dtype: type | str, shape: Sequence[int | str]) -> None:
        self.outputs.append(_value_info(name, _element(dtype), shape))

    def constant(self, name: str, value: npt.NDArray[np.generic]) -> None:
        body = b"".join(_varint_field(1, dim) for dim in value.shape)
        body += _varint_field(2, ELEMENT_TYPES[value.dtype])
        body += _bytes_field(8, name.encode()) + _bytes_field(9, value.tobytes())
        self.constants.append(body)

    def node(self, op: str, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        body = b"".join(_bytes_field(1, name.encode()) for name in inputs)
        body += b"".join(_bytes_field(2, name.encode()) for name in outputs)
        body += _bytes_field(3, f"{op}_{len(self.nodes)}".encode()) + _bytes_field(4, op.encode())
        self.nodes.append(body)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.encode())

    def encode(self) -> bytes:
        """The ModelProto's bytes."""
        graph = b"".join(_bytes_field(1, node) for node in self.nodes)
        graph += _bytes_field(2, self.name.encode())
        graph += b"".join(_bytes_field(5, constant) for constant in self.constants)
        graph += b"".join(_bytes_field(11, item) for item in self.inputs)
        graph += b"".join(_bytes_field(12, item) for item in self.outputs)
        opset = _bytes_field(1, b"") + _varint_field(2, OPSET)
        model = _varint_field(1, IR_VERSION) + _bytes_field(2, b"tests/onnx_graph.py")
        return model + _bytes_field(7, graph) + _bytes_field(8, opset)


def _element(dtype: type | str) -> int:
    if isinstance(dtype, str) and dtype in ELEMENT_TYPES:
        return ELEMENT_TYPES[dtype]
    return ELEMENT_TYPES[np.dtype(_NAMED.get(dtype, dtype) if isinstance(dtype, str) else dtype)]


def _value_info(name: str, element: int, shape: Sequence[int | str]) -> bytes:
    # A Dimension holds dim_value (1), dim_param (2), or neither: unknown.
    dims = b""
    for dim in shape:
        if isinstance(dim, str):
            dims += _bytes_field(1, _bytes_field(2, dim.encode()))
        elif dim >= 0:
            dims += _bytes_field(1, _varint_field(1, dim))
        else:
            dims += _bytes_field(1, b"")
    tensor = _varint_field(1, element) + _bytes_field(2, dims)
    return _bytes_field(1, name.encode()) + _bytes_field(2, _bytes_field(1, tensor))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes_field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value
