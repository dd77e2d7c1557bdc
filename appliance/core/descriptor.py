"""Descriptors: the only format that crosses a ZeroMQ socket.

A message is one ZeroMQ frame::

    +-------------------------------+-----------------+-----------------------+
    | header, struct '<2sBBHHIQdI'  | body (JSON)     | inline payloads, in   |
    | 32 bytes                      | body length B   | the order of "inline" |
    +-------------------------------+-----------------+-----------------------+

    header: 'AP' | version u8 | kind u8 | code u16 | channel u16 | pid u32 |
            request id u64 | deadline f64 | body length u32

``pid`` and ``channel`` name the sender: a client's (pid, channel) is where
its replies go (see :mod:`appliance.core.tree`), a worker's pid says which
instance answered.

One frame, not one per part: every frame is a separate call into libzmq,
and on this machine kind each costs more than the bytes it carries. For the
same reason a frame may carry several messages back to back (each message's
header and body say where it ends): an event loop's requests to one
instance made in the same loop turn, or a worker's replies to one channel,
go as one frame, one send and one wake-up of each side's I/O thread.

``deadline`` is CLOCK_MONOTONIC seconds (the same clock in every process on a
host), 0 for none. ``code`` is an :class:`~appliance.errors.ErrorCode`; a
non-zero code carries ``{"message": ...}`` as its body.

In a body, each tensor is ``[name, dtype, shape, place]``, or
``[name, dtype, shape, place, parameters]`` for a reply's output the model
gave parameters (see :mod:`appliance.core.output_parameters`), where ``place`` is
an int (the index of its inline payload; the body's ``"inline"`` lists the
payloads' lengths), ``[segment, offset, nbytes]`` (its bytes in a
shared-memory segment) or ``{"cuda": [...]}`` (in a client's GPU memory; see
:mod:`appliance.core.device_tensors`). Tensor bytes above the inline
threshold never travel through a socket. A reply's ``"borrowed"`` names the
outputs that are views of the request's own inputs (pass-through, see
worker/passthrough.py): their bytes are not the worker's to lease.

A segment may be any process's of the tree: a request's tensor may lie in
the sender's request ring, or (a :class:`Placed` tensor: an ensemble's
intermediate, see appliance/client/ensemble_run.py) in the response ring of the
worker that made it, read in place by the next.

SAFETY: payloads are sent with copying sends; a view of a ring is never
handed to ``send(copy=False)``, where libzmq would hold it while the ring
reuses the space.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from appliance.core.client_memory import ClientTensor
from appliance.core.device_tensors import CudaPlace, DeviceTensor, empty_like, is_cuda_place
from appliance.core.dtypes import DType, to_numpy
from appliance.core.output_parameters import parameters_of
from appliance.core.ring import Block
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest, ErrorCode

HEADER = struct.Struct("<2sBBHHIQdI")
_HEADER_SIZE = HEADER.size
_UNPACK = HEADER.unpack_from
# PERF: a dtype's name by lookup; an enum's .value costs ten times as much.
_NAMES = {dtype: dtype.value for dtype in DType}
# Inline tensors up to this size are copied out whole (a copy costs less than a view here).
SMALL = 1024
MAGIC = b"AP"
VERSION = 1


class Kind(enum.IntEnum):
    """Message kinds; see the module docstring for their bodies."""

    INFER = 1  # client -> worker: {model, method, params, outputs, tensors, args}
    REPLY = 2  # worker -> client: {tensors} or an error
    PART = 3  # worker -> client: one streamed part {tensors}
    END = 4  # worker -> client: the stream is over (or failed)
    RELEASE = 5  # client -> worker: {blocks: [[segment, offset, nbytes], ...]}
    CANCEL = 6  # client -> worker: stop the stream request_id
    GOODBYE = 7  # client -> worker: this channel closes; forget it
    PAUSE = 8  # client -> worker: hold the stream request_id; its reader fell behind
    RESUME = 9  # client -> worker: go on with the stream request_id


@dataclass(slots=True, init=False)
class Message:
    """A decoded message: header fields, body and inline payloads.

    PERF: its ``__init__`` is written out, not generated: compiled, the
    dataclass one still runs as Python, at four times the cost, for every
    request and reply.
    """

    kind: Kind
    request_id: int
    pid: int
    body: dict[str, Any]
    payloads: list[Any]
    code: int
    deadline: float
    channel: int

    def __init__(
        self,
        kind: Kind,
        request_id: int,
        pid: int,
        body: dict[str, Any] | None = None,
        payloads: list[Any] | None = None,
        code: int = 0,
        deadline: float = 0.0,
        channel: int = 0,
    ) -> None:
        self.kind = kind
        self.request_id = request_id
        self.pid = pid
        self.body = {} if body is None else body
        self.payloads = [] if payloads is None else payloads
        self.code = code
        self.deadline = deadline
        self.channel = channel

    @property
    def error_message(self) -> str:
        return str(self.body.get("message", "unknown error"))

    @property
    def error_status(self) -> int:
        """The HTTP status the model chose for its failure (0: none)."""
        status = self.body.get("status", 0)
        return status if type(status) is int else 0


class DescriptorError(ValueError):
    """A frame that is not a valid message (a bug or a foreign peer)."""


def to_frame(message: Message) -> bytes:
    """Encode a message as the single frame to send."""
    body = message.body
    payloads = message.payloads
    if payloads:
        sizes = [len(p) if type(p) is bytes else memoryview(p).nbytes for p in payloads]
        body = {**body, "inline": sizes}
    encoded = orjson.dumps(body)
    header = HEADER.pack(
        MAGIC,
        VERSION,
        message.kind,
        message.code,
        message.channel,
        message.pid,
        message.request_id,
        message.deadline,
        len(encoded),
    )
    if not payloads:
        return header + encoded
    return b"".join([header, encoded, *payloads])


_KINDS = {int(kind): kind for kind in Kind}


def from_frame(frame: bytes | memoryview) -> Message:
    """Decode a frame that holds exactly one message.

    Raises:
        DescriptorError: the frame is not a message of this version.
    """
    message, end = _decode(memoryview(frame), 0, len(frame))
    if end != len(frame):
        raise DescriptorError(f"descriptor frame has {len(frame) - end} stray bytes")
    return message


def from_frames(frame: bytes) -> list[Message]:
    """Decode every message of a frame received with ``recv`` (see :func:`join_frames`).

    Raises:
        DescriptorError: a message in it is not a message of this version;
            the frame's other messages are lost with it.
    """
    view = memoryview(frame)
    size = len(view)
    message, end = _decode(view, 0, size)
    if end == size:
        return [message]
    messages = [message]
    while end < size:
        message, end = _decode(view, end, size)
        messages.append(message)
    return messages


def join_frames(frames: Sequence[bytes]) -> bytes:
    """One frame that carries the messages of ``frames``, in order."""
    return frames[0] if len(frames) == 1 else b"".join(frames)


def _decode(view: memoryview, start: int, size: int) -> tuple[Message, int]:
    """The message that starts at ``start`` of ``view`` (``size`` bytes), and where it ends."""
    begin = start + _HEADER_SIZE
    if begin > size:
        raise DescriptorError(f"a message needs {_HEADER_SIZE} header bytes, got {size - start}")
    magic, version, kind, code, channel, pid, request_id, deadline, length = _UNPACK(view, start)
    message_kind = _KINDS.get(kind)
    if magic != MAGIC or version != VERSION or message_kind is None:
        raise DescriptorError(f"unknown descriptor {magic!r} version {version} kind {kind}")
    end = begin + length
    if end > size:
        raise DescriptorError(f"a descriptor body of {length} bytes runs past its frame")
    try:
        body = orjson.loads(view[begin:end])
        sizes = body.pop("inline", None)
        payloads: list[Any] = []
        if sizes:
            for nbytes in sizes:
                # A negative size would slice backwards over the header.
                if type(nbytes) is not int or nbytes < 0:
                    raise TypeError(f"inline payload size {nbytes!r} is not a byte count")
                payloads.append(view[end : end + nbytes])
                end += nbytes
    except (orjson.JSONDecodeError, TypeError, AttributeError) as ex:
        raise DescriptorError(f"bad descriptor body: {ex}") from None
    if end > size:
        raise DescriptorError(f"inline payloads run {end - size} bytes past their frame")
    return Message(message_kind, request_id, pid, body, payloads, code, deadline, channel), end


def error_message(
    kind: Kind, request_id: int, pid: int, code: ErrorCode, text: str, status: int = 0
) -> Message:
    """Build a reply that carries an error instead of tensors (and the HTTP status
    the model chose for it, when it did)."""
    body: dict[str, Any] = {"message": text, "status": status} if status else {"message": text}
    return Message(kind, request_id, pid, body, code=int(code))


# -- tensors in messages ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placed:
    """A tensor whose bytes already lie in shared memory: sent as a reference, never copied.

    The sender keeps ``block`` alive (and unchanged) until the receiver has answered.
    """

    dtype: DType
    shape: tuple[int, ...]
    block: Block


class Allocator(Protocol):
    """Where tensor bytes go: a :class:`~appliance.core.ring.Ring` or a wrapper."""

    def alloc(self, nbytes: int) -> Block: ...

    def view(self, block: Block) -> memoryview: ...


def place_tensors(
    tensors: Mapping[str, Tensor | DeviceTensor | ClientTensor | Placed],
    ring: Allocator,
    inline_threshold: int,
    payloads: list[Any],
    blocks: list[Block],
) -> list[list[Any]]:
    """Write tensors into a message: small ones inline, the rest into ``ring``.

    Outputs a model gave parameters (an OutputsWithParameters) carry them
    in their entries. Appends inline payloads to ``payloads`` and the ring blocks used to
    ``blocks`` (the caller releases them when the peer is done). A tensor in
    a client's file is read straight into its block (or payload): its one copy.

    Raises:
        TooLarge, Overloaded: from the ring.
        BadRequest: a client's file shrank, vanished or was replaced.
    """
    entries: list[list[Any]] = []
    for name, tensor in tensors.items():
        if type(tensor) is DeviceTensor:
            entries.append([name, _NAMES[tensor.dtype], list(tensor.shape), tensor.place.to_body()])
            continue
        if type(tensor) is ClientTensor:
            entries.append(_place_client(name, tensor, ring, inline_threshold, payloads, blocks))
            continue
        if type(tensor) is Placed:
            where = tensor.block
            at = [where.segment, where.offset, where.nbytes]
            entries.append([name, _NAMES[tensor.dtype], list(tensor.shape), at])
            continue
        assert isinstance(tensor, Tensor)
        dtype = tensor.dtype
        place: Any
        if dtype is not DType.BYTES and tensor.array().nbytes <= min(inline_threshold, SMALL):
            # PERF: a small array's bytes in one call, rather than a flat byte view of it.
            place = len(payloads)
            payloads.append(tensor.array().tobytes())
        else:
            raw = tensor.raw()
            nbytes = raw.nbytes
            if nbytes <= inline_threshold:
                place = len(payloads)
                payloads.append(raw)
            else:
                block = ring.alloc(nbytes)
                blocks.append(block)
                ring.view(block)[:] = raw
                place = [block.segment, block.offset, block.nbytes]
        entries.append([name, _NAMES[dtype], list(tensor.shape), place])
    described = None if type(tensors) is dict else parameters_of(tensors)
    if described:
        for entry in entries:
            if entry[0] in described:
                entry.append(described[entry[0]])
    return entries


def _place_client(
    name: str,
    tensor: ClientTensor,
    ring: Allocator,
    inline_threshold: int,
    payloads: list[Any],
    blocks: list[Block],
) -> list[Any]:
    """:func:`place_tensors` for a tensor in a client's file."""
    span = tensor.span
    place: Any
    if span.nbytes <= inline_threshold:
        place = len(payloads)
        payloads.append(span.read())
    else:
        block = ring.alloc(span.nbytes)
        blocks.append(block)
        span.read_into(ring.view(block))
        place = [block.segment, block.offset, block.nbytes]
    return [name, tensor.dtype.value, list(tensor.shape), place]


class Views(Protocol):
    """What reading tensors needs of a :class:`SegmentReader`: a view of a segment's bytes."""

    def view(self, segment: str, offset: int, nbytes: int) -> memoryview: ...


class SegmentReader:
    """Read tensors out of other processes' segments, mapping each once.

    Args:
        attach: maps a segment by name (read-only); raising
            FileNotFoundError if it is gone.
        keep: which segments stay mapped for later reads (all by default);
            the mapping of any other lives as long as the views of it.
    """

    def __init__(self, attach: Any, keep: Callable[[str], bool] | None = None) -> None:
        self._attach = attach
        self._keep = keep
        self._segments: dict[str, Any] = {}
        self._bases: dict[str, int] = {}

    def view(self, segment: str, offset: int, nbytes: int) -> memoryview:
        mapped = self._segments.get(segment)
        if mapped is None:
            mapped = self._attach(segment)
            if self._keep is None or self._keep(segment):
                self._segments[segment] = mapped
                first = np.frombuffer(mapped.buffer, dtype=np.uint8, count=min(1, mapped.size))
                self._bases[segment] = int(first.__array_interface__["data"][0])
        if offset < 0 or nbytes < 0 or offset + nbytes > mapped.size:
            raise DescriptorError(
                f"block [{offset}, {offset + nbytes}) lies outside segment {segment}"
            )
        return memoryview(mapped.buffer)[offset : offset + nbytes]

    def base(self, segment: str) -> int:
        """The address of a mapped segment's first byte in this process."""
        return self._bases[segment]

    def forget(self, segment: str) -> bool:
        """Unmap one segment; return False if views of it are still alive."""
        mapped = self._segments.get(segment)
        if mapped is None:
            return True
        if mapped.close():
            del self._segments[segment]
            del self._bases[segment]
            return True
        return False

    def names(self) -> list[str]:
        return list(self._segments)

    def close(self) -> None:
        for name in list(self._segments):
            self.forget(name)


_DTYPES = {dtype.value: dtype for dtype in DType}


def read_tensors(
    entries: Iterable[Sequence[Any]], payloads: Sequence[Any], reader: Views
) -> dict[str, Tensor]:
    """Rebuild tensors from body entries; ring data is viewed, not copied.

    A tensor in a client's GPU memory comes as a placeholder of its shape
    and dtype that holds no bytes: the model worker puts the data in its
    place (appliance/worker/cuda_regions.py), and a reply's output that the
    worker wrote into the client's region needs none.

    Raises:
        BadRequest: an entry is malformed or its bytes do not fit its shape.
    """
    tensors: dict[str, Tensor] = {}
    for entry in entries:
        try:
            # A reply's output may carry its parameters fifth (see place_tensors).
            name, dtype_name, shape, place = entry if len(entry) == 4 else entry[:4]
            dtype = _DTYPES[dtype_name]
            if type(place) is int:
                if place < 0:
                    raise IndexError(f"inline payload {place} does not exist")
                data: Any = payloads[place]
            elif is_cuda_place(place):
                tensors[str(name)] = _placeholder(dtype, shape, place)
                continue
            else:
                data = reader.view(str(place[0]), int(place[1]), int(place[2]))
            tensors[str(name)] = _tensor(dtype, shape, data)
        except (ValueError, TypeError, IndexError, KeyError, FileNotFoundError) as ex:
            raise BadRequest(f"tensor descriptor {entry!r:.120} is invalid: {ex}") from None
    return tensors


def _placeholder(dtype: DType, shape: Sequence[int], place: Any) -> Tensor:
    _check_shape(shape)
    if dtype is DType.BYTES:
        raise ValueError("BYTES tensors cannot lie in GPU memory")
    CudaPlace.from_body(place)  # raises ValueError for a malformed place
    return Tensor(dtype, tuple(shape), empty_like(shape, dtype))


def _check_shape(shape: Sequence[int]) -> None:
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise ValueError(f"shape {shape!r} must hold integers >= 0")


def _tensor(dtype: DType, shape: Sequence[int], data: Any) -> Tensor:
    _check_shape(shape)
    if dtype is DType.BYTES:
        return Tensor(dtype, shape, memoryview(data).cast("B"))
    array = np.frombuffer(data, dtype=to_numpy(dtype)).reshape(shape)
    return Tensor(dtype, array.shape, array)


def block_list(blocks: Iterable[Block]) -> list[list[Any]]:
    return [[block.segment, block.offset, block.nbytes] for block in blocks]


def blocks_from(entries: Iterable[Sequence[Any]]) -> list[Block]:
    """Parse ``[[segment, offset, nbytes], ...]``; malformed entries are skipped."""
    blocks = []
    for entry in entries:
        try:
            blocks.append(Block(str(entry[0]), int(entry[1]), int(entry[2])))
        except (TypeError, ValueError, IndexError):
            continue
    return blocks


def ring_blocks(
    entries: Iterable[Sequence[Any]], borrowed: Sequence[str] | None = None
) -> list[Block]:
    """Return the ring blocks (not inline payloads, not GPU places) named by tensor entries.

    ``borrowed``: names of entries to leave out (a reply's pass-through outputs).
    """
    places = [
        entry[3]
        for entry in entries
        if type(entry[3]) is list and not (borrowed and entry[0] in borrowed)
    ]
    return blocks_from(places) if places else []


def leased_blocks(body: Mapping[str, Any]) -> list[Block]:
    """The blocks a reply's worker leased to its client: its ring blocks less the borrowed."""
    return ring_blocks(body.get("tensors", ()), body.get("borrowed"))
