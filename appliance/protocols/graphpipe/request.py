"""Read an untrusted GraphPipe ``Request`` in one checked pass.

A hostile buffer would make flatbuffers' generated accessors raise
IndexError or struct.error from deep inside, or loop over a vector length
of four billion: they trust every offset they follow. So this reads the
request itself, walking the schema once as the C++ flatbuffers Verifier
does: every table, vtable, field, vector and string is checked to lie
inside the body before it is read. Unsigned offsets only point forward, so
the walk ends; the data it finds is counted, so a request whose tensors
share (overlap) their bytes cannot multiply into more memory than it sent.
PERF: one pass; checking first and then reading through the generated
accessors cost GraphPipe about a quarter of its frontend time per request.

Numeric tensor data stays a view over the body: the ``data`` vector is only
4-byte aligned (SPEC: PROTOCOL-FACTS §1.1), so a typed view of it may be
unaligned; numpy marks it so and copes.

SPEC: PROTOCOL-FACTS §1.1 for the slot table; flatbuffers' binary format
for tables (an int32 back to the vtable; the vtable holds its own size, the
table's size and one uint16 offset per field, 0 when absent).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from appliance.protocols.graphpipe.errors import DecodeError

# SPEC: PROTOCOL-FACTS §1.1 — union tags of Req.
REQ_NONE, REQ_INFER, REQ_METADATA = 0, 1, 2

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_SHAPE = np.dtype("<i8")


@dataclass(frozen=True, slots=True)
class WireTensor:
    """A tensor as it came: type number, shape, and data or strings."""

    type: int
    shape: tuple[int, ...]
    data: npt.NDArray[np.uint8] | None
    strings: list[bytes] | None


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A decoded InferRequest; names are "" where the client gave none."""

    config: bytes
    input_names: list[str]
    inputs: list[WireTensor]
    output_names: list[str]


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    """A MetadataRequest, or any Request that is not an InferRequest."""


class _Reader:
    """Checked little-endian reads from the body."""

    __slots__ = ("buf", "payload_bytes", "size")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.size = len(buf)
        self.payload_bytes = 0

    def need(self, pos: int, length: int, what: str) -> None:
        if pos < 0 or pos + length > self.size:
            raise DecodeError(
                f"{what} at byte {pos} ({length} bytes) lies outside the {self.size}-byte body"
            )

    def read(self, fmt: struct.Struct, pos: int, what: str) -> int:
        self.need(pos, fmt.size, what)
        value: int = fmt.unpack_from(self.buf, pos)[0]
        return value

    def vector(self, pos: int, item_bytes: int, what: str) -> tuple[int, int]:
        """Check a vector (uint32 length, then items); return (start, length)."""
        length = self.read(_U32, pos, f"{what} length")
        self.need(pos + 4, length * item_bytes, what)
        return pos + 4, length

    def follow(self, pos: int, what: str) -> int:
        """Return where the uoffset stored at ``pos`` points."""
        return pos + self.read(_U32, pos, what)

    def spend(self, nbytes: int) -> None:
        """Count tensor payload; more than the body means vectors overlap."""
        self.payload_bytes += nbytes
        if self.payload_bytes > self.size:
            raise DecodeError(
                "tensor data and strings add up to more bytes than the body holds: "
                "their vectors overlap, which a GraphPipe request never needs"
            )


class _Table:
    """A checked table: its vtable and object size lie inside the body."""

    __slots__ = ("object_size", "pos", "reader", "vtable", "vtable_size", "what")

    def __init__(self, reader: _Reader, pos: int, what: str) -> None:
        self.reader, self.pos, self.what = reader, pos, what
        self.vtable = pos - reader.read(_I32, pos, what)
        self.vtable_size = reader.read(_U16, self.vtable, f"{what} vtable")
        self.object_size = reader.read(_U16, self.vtable + 2, f"{what} vtable")
        if self.vtable_size < 4 or self.vtable_size % 2:
            raise DecodeError(f"{what} has a vtable of {self.vtable_size} bytes")
        reader.need(self.vtable, self.vtable_size, f"{what} vtable")
        if self.object_size < 4:
            raise DecodeError(f"{what} claims a size of {self.object_size} bytes")
        reader.need(pos, self.object_size, what)

    def field(self, slot: int, nbytes: int) -> int | None:
        """Return the position of a present field, checked to fit its table."""
        entry = 4 + 2 * slot
        if entry >= self.vtable_size:
            return None
        offset = self.reader.read(_U16, self.vtable + entry, f"{self.what} vtable")
        if offset == 0:
            return None
        if offset < 4 or offset + nbytes > self.object_size:
            raise DecodeError(f"{self.what} field {slot} lies outside its table")
        return self.pos + offset

    def target(self, slot: int) -> int | None:
        """Return where an offset field (table, vector, string) points."""
        at = self.field(slot, 4)
        return None if at is None else self.reader.follow(at, f"{self.what} field {slot}")

    def vector(self, slot: int, item_bytes: int, what: str) -> tuple[int, int] | None:
        at = self.target(slot)
        return None if at is None else self.reader.vector(at, item_bytes, what)

    def strings(self, slot: int, what: str, payload: bool = False) -> list[bytes] | None:
        """Read a vector of strings (None when absent); ``payload``: count their bytes."""
        found = self.vector(slot, 4, what)
        if found is None:
            return None
        reader = self.reader
        start, length = found
        strings = []
        for index in range(length):
            where = reader.follow(start + 4 * index, f"{what}[{index}]")
            first, size = reader.vector(where, 1, f"{what}[{index}]")
            if payload:
                # Counted before it is copied out of the body.
                reader.spend(size)
            strings.append(reader.buf[first : first + size])
        return strings

    def tables(self, slot: int, what: str) -> Iterator[_Table]:
        found = self.vector(slot, 4, what)
        if found is not None:
            start, length = found
            for index in range(length):
                where = self.reader.follow(start + 4 * index, f"{what}[{index}]")
                yield _Table(self.reader, where, f"{what}[{index}]")


def read_request(buf: bytes) -> InferRequest | MetadataRequest:
    """Read a ``Request`` buffer.

    SPEC: PROTOCOL-FACTS §1.2 — like the Go reference server, any Request
    that is not an InferRequest is answered with metadata; only the
    InferRequest branch is read in full.

    Raises:
        DecodeError: the buffer is not a well-formed Request.
    """
    reader = _Reader(buf)
    root = _Table(reader, reader.follow(0, "root offset"), "Request")
    tag_at = root.field(0, 1)
    tag = 0 if tag_at is None else reader.read(_U8, tag_at, "Request.req_type")
    body = root.target(1)
    if tag == REQ_INFER:
        if body is None:
            raise DecodeError("Request says InferRequest but holds none")
        return _infer_request(_Table(reader, body, "InferRequest"))
    if tag == REQ_METADATA and body is not None:
        _Table(reader, body, "MetadataRequest")
    return MetadataRequest()


def _infer_request(table: _Table) -> InferRequest:
    reader = table.reader
    config = b""
    at = table.target(0)
    if at is not None:
        start, length = reader.vector(at, 1, "InferRequest.config")
        config = reader.buf[start : start + length]
    input_names = _names(table.strings(1, "InferRequest.input_names"), "input_names")
    inputs = [_tensor(tensor) for tensor in table.tables(2, "InferRequest.input_tensors")]
    output_names = _names(table.strings(3, "InferRequest.output_names"), "output_names")
    return InferRequest(config, input_names, inputs, output_names)


def _names(raw: list[bytes] | None, what: str) -> list[str]:
    names = []
    for index, name in enumerate(raw or ()):
        try:
            names.append(name.decode())
        except UnicodeDecodeError:
            raise DecodeError(f"{what}[{index}] is not UTF-8 text") from None
    return names


def _tensor(tensor: _Table) -> WireTensor:
    reader = tensor.reader
    at = tensor.field(0, 1)
    kind = 0 if at is None else reader.read(_U8, at, f"{tensor.what}.type")
    shape: tuple[int, ...] = ()
    found = tensor.vector(1, 8, f"{tensor.what}.shape")
    if found is not None and found[1]:
        dims = np.frombuffer(reader.buf, _SHAPE, found[1], found[0])
        shape = tuple(int(dim) for dim in dims)
    data = None
    found = tensor.vector(2, 1, f"{tensor.what}.data")
    if found is not None and found[1]:
        reader.spend(found[1])
        data = np.frombuffer(reader.buf, np.uint8, found[1], found[0])
    strings = tensor.strings(3, f"{tensor.what}.string_val", payload=True)
    return WireTensor(kind, shape, data, strings)
