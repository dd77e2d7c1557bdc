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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from appliance.errors import ErrorCode

HEADER = struct.Struct("<2sBBHHIQdI")
_HEADER_SIZE = HEADER.size
_UNPACK = HEADER.unpack_from
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
