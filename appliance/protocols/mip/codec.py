"""MIP framing, sans-IO: bytes in, frames out; frames in, bytes out.

SPEC: specs/mip.md and PROTOCOL-FACTS §4.1. Every header field is big-endian::

    fixed header (8 bytes)
    +---------+------+---------+----------+------------------------+
    | version | kind | subtype | reserved | remaining size (u32)   |
    | u8 = 0  | u8   | u8      | u8 = 0   | bytes of payload after |
    +---------+------+---------+----------+------------------------+

    inference payload (kind 2)
    +---------+----------+------------------+----------------------------+
    | n-input | n-output | batch size (u16) | batch-major TLV items ...  |
    | u8      | u8       |                  | type u32, length u32, data |
    +---------+----------+------------------+----------------------------+

:class:`FrameReader` is fed received bytes (or lends its buffer to a
``BufferedProtocol``) and yields :class:`Frame`, :class:`Oversized` or
:class:`BadVersion` events, or None when it needs more data, in the h11
style. The functions below it encode replies. Nothing here does I/O; a
malformed payload raises :class:`MipError`, never anything else.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

HEADER = struct.Struct("!4BL")
INFER_HEADER = struct.Struct("!2BH")
ITEM_HEADER = struct.Struct("!2L")
VERSION = 0
MAX_U32 = 0xFFFFFFFF
# Error frames carry a UTF-8 message as payload; KubeMo's client reads and
# discards an error's payload (PROTOCOL-FACTS §4.3), so this costs it nothing.
MAX_MESSAGE_BYTES = 4096
# The most items (n-input x batch size) one inference request may hold.
MAX_ITEMS = 65536
_RECEIVE_BYTES = 64 * 1024
_FIRST_PAYLOAD_BYTES = 256 * 1024
_MIN_FREE_BYTES = 4096


class Kind(enum.IntEnum):
    ERROR = 0
    PING = 1
    INFERENCE = 2


class Subtype(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1


class ErrorCode(enum.IntEnum):
    """The error subtypes (sent with kind 0). SPEC: PROTOCOL-FACTS §4.1."""

    PROTOCOL = 0
    SUBTYPE = 1
    METHOD = 2
    MEMORY = 3
    SHAPE = 4
    INTERNAL = 5


class ItemType(enum.IntEnum):
    """TLV item types: KubeMo's three (PROTOCOL-FACTS §4.1) and our TENSOR."""

    TEXT = 1
    JSON = 2
    IMAGE = 3
    TENSOR = 4


class MipError(Exception):
    """A request the server answers with an error frame."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"MipError({self.code.name}, {self.message!r})"


# -- frames -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    kind: int
    subtype: int
    remaining: int


@dataclass(frozen=True, slots=True)
class Frame:
    """A complete frame: its header and its whole payload."""

    header: Header
    payload: bytes | bytearray


@dataclass(frozen=True, slots=True)
class Oversized:
    """A header whose payload exceeds the limit; the reader skips the payload."""

    header: Header


@dataclass(frozen=True, slots=True)
class BadVersion:
    """A header with an unknown version: the framing is lost, the reader stops."""

    header: Header


Event = Frame | Oversized | BadVersion


def decode_header(data: bytes | bytearray | memoryview) -> Header:
    """Decode the 8-byte fixed header."""
    version, kind, subtype, _reserved, remaining = HEADER.unpack(data)
    return Header(version, kind, subtype, remaining)


class FrameReader:
    """Split a byte stream into MIP frames.

    Args:
        max_frame_bytes: the largest payload (remaining size) accepted; a
            larger one is reported as :class:`Oversized` and skipped unread.

    Bytes go in through :meth:`feed`, or through :meth:`get_buffer` and
    :meth:`buffer_updated` (the ``asyncio.BufferedProtocol`` pair, which
    lets a large payload be received straight into its own buffer).
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        # SAFETY: a buffer lent out by get_buffer may still be referenced by
        # the caller; it is never resized, only replaced.
        self._buf = bytearray(_RECEIVE_BYTES)
        self._start = 0
        self._end = 0
        self._header: Header | None = None
        self._payload: bytearray | None = None
        self._filled = 0
        self._skip = 0
        self._into_payload = False
        self.closed = False

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame has arrived but not all of it."""
        return self._header is not None or self._skip > 0 or self._end > self._start

    def get_buffer(self) -> memoryview:
        """Return a writable buffer for the next received bytes (never empty)."""
        payload, header = self._payload, self._header
        receiving = header is not None and self._filled < header.remaining
        if payload is not None and receiving and self._start == self._end:
            if self._filled == len(payload):
                payload = self._grow()
            self._into_payload = True
            return memoryview(payload)[self._filled :]
        self._into_payload = False
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buf) - self._end < _MIN_FREE_BYTES:
            pending = self._end - self._start
            if pending + _MIN_FREE_BYTES <= len(self._buf):
                self._buf[:pending] = self._buf[self._start : self._end]
            else:
                grown = bytearray(2 * len(self._buf))
                grown[:pending] = self._buf[self._start : self._end]
                self._buf = grown
            self._start, self._end = 0, pending
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """Record that ``nbytes`` were written into the last :meth:`get_buffer`."""
        if self._into_payload:
            self._filled += nbytes
        elif self.closed:
            self._start = self._end = 0
        else:
            self._end += nbytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes."""
        view = memoryview(data).cast("B")
        while view:
            target = self.get_buffer()
            count = min(len(target), len(view))
            target[:count] = view[:count]
            self.buffer_updated(count)
            view = view[count:]

    def close(self) -> None:
        """Stop framing: every later byte is discarded."""
        self.closed = True
        self._header = self._payload = None
        self._start = self._end = self._skip = 0

    def next_event(self) -> Event | None:
        """Return the next complete event, or None until more bytes arrive."""
        while not self.closed:
            if self._skip:
                taken = min(self._skip, self._end - self._start)
                self._start += taken
                self._skip -= taken
                if self._skip:
                    return None
            elif self._header is None:
                if self._end - self._start < HEADER.size:
                    return None
                event = self._begin(decode_header(self._buf[self._start : self._start + 8]))
                self._start += HEADER.size
                if event is not None:
                    return event
            else:
                return self._fill()
        self._start = self._end = 0
        return None

    def _begin(self, header: Header) -> Event | None:
        if header.version != VERSION:
            self.close()
            return BadVersion(header)
        if header.remaining > self.max_frame_bytes:
            self._skip = header.remaining
            return Oversized(header)
        if header.remaining == 0:
            return Frame(header, b"")
        self._header = header
        # The payload buffer grows as bytes arrive (see _grow): a header alone
        # claiming max_frame_bytes must not cost that much memory.
        self._payload = bytearray(min(header.remaining, _FIRST_PAYLOAD_BYTES))
        self._filled = 0
        return None

    def _grow(self) -> bytearray:
        """Replace a full payload buffer by one four times as large (up to the frame's size).

        PERF: growing 4x copies a third of the payload once more, in all. The
        old buffer is replaced, never resized, since it may still be lent out.
        """
        assert self._header is not None
        assert self._payload is not None
        size = min(4 * len(self._payload), self._header.remaining)
        grown = bytearray(size)
        grown[: self._filled] = self._payload
        self._payload = grown
        return grown

    def _fill(self) -> Frame | None:
        header, payload = self._header, self._payload
        assert header is not None
        assert payload is not None
        while (pending := self._end - self._start) and self._filled < header.remaining:
            if self._filled == len(payload):
                payload = self._grow()
            taken = min(len(payload) - self._filled, pending)
            payload[self._filled : self._filled + taken] = self._buf[
                self._start : self._start + taken
            ]
            self._filled += taken
            self._start += taken
        if self._filled < header.remaining:
            return None
        self._header = self._payload = None
        return Frame(header, payload)


# -- inference payloads ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    """One TLV item: its type code and its bytes (a view into the payload)."""

    type: ItemType
    data: memoryview


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A decoded inference payload; ``items`` are batch-major."""

    n_input: int
    n_output: int
    batch_size: int
    items: tuple[Item, ...]

    def item(self, element: int, position: int) -> Item:
        return self.items[element * self.n_input + position]


def decode_infer_request(payload: bytes | bytearray | memoryview) -> InferRequest:
    """Split an inference payload into its items.

    Raises:
        MipError: SHAPE when the payload does not match its own header or an
            item type is unknown; MEMORY when it holds more than MAX_ITEMS items.
    """
    view = memoryview(payload).cast("B")
    if len(view) < INFER_HEADER.size:
        raise MipError(
            ErrorCode.SHAPE,
            f"inference payload has {len(view)} bytes; it needs at least the 4-byte "
            "n-input, n-output, batch size header",
        )
    n_input, n_output, batch_size = INFER_HEADER.unpack_from(view)
    if n_input == 0 or batch_size == 0:
        raise MipError(
            ErrorCode.SHAPE,
            f"inference request has n-input {n_input} and batch size {batch_size}; "
            "both must be at least 1",
        )
    if n_input * batch_size > MAX_ITEMS:
        # Each item becomes Python objects and a decoded row, hundreds of
        # bytes for an 8-byte empty item: a frame of millions of them would
        # cost gigabytes.
        raise MipError(
            ErrorCode.MEMORY,
            f"inference request has n-input {n_input} x batch size {batch_size} = "
            f"{n_input * batch_size} items; at most {MAX_ITEMS} are served per request",
        )
    items = []
    offset = INFER_HEADER.size
    for index in range(n_input * batch_size):
        if offset + ITEM_HEADER.size > len(view):
            raise MipError(ErrorCode.SHAPE, _short(index, n_input, batch_size, "its header"))
        code, length = ITEM_HEADER.unpack_from(view, offset)
        offset += ITEM_HEADER.size
        if offset + length > len(view):
            raise MipError(ErrorCode.SHAPE, _short(index, n_input, batch_size, f"{length} bytes"))
        items.append(Item(_item_type(code, index, n_input), view[offset : offset + length]))
        offset += length
    if offset != len(view):
        raise MipError(
            ErrorCode.SHAPE,
            f"inference payload has {len(view) - offset} bytes after its "
            f"{n_input} x {batch_size} items",
        )
    return InferRequest(n_input, n_output, batch_size, tuple(items))


def _item_type(code: int, index: int, n_input: int) -> ItemType:
    try:
        return ItemType(code)
    except ValueError:
        known = ", ".join(f"{t.value} {t.name}" for t in ItemType)
        raise MipError(
            ErrorCode.SHAPE,
            f"item {index} (batch element {index // n_input}, input {index % n_input}) has "
            f"unknown type {code}; the types are {known}",
        ) from None


def _short(index: int, n_input: int, batch_size: int, what: str) -> str:
    return (
        f"inference payload ends inside item {index} (batch element {index // n_input}, "
        f"input {index % n_input}) before {what}; the header announced "
        f"{n_input} inputs x {batch_size} elements"
    )


Piece = bytes | bytearray | memoryview


def encode_item(item_type: ItemType, data: Sequence[Piece]) -> list[Piece]:
    """Return a TLV item as pieces: its type and length, then ``data``."""
    length = sum(len(part) for part in data)
    return [ITEM_HEADER.pack(item_type, length), *data]


def encode_infer_response(
    n_input: int, n_output: int, batch_size: int, items: Sequence[Piece]
) -> bytes:
    """Return a whole inference response frame around encoded ``items``.

    SPEC: PROTOCOL-FACTS §4.2 — n-output is the true output count (the
    reference server's n-input there is a bug the client cannot survive).

    Raises:
        MipError: MEMORY when the payload does not fit the u32 remaining size.
    """
    remaining = INFER_HEADER.size + sum(len(part) for part in items)
    if remaining > MAX_U32:
        raise MipError(
            ErrorCode.MEMORY,
            f"the response would have {remaining} bytes of payload; a MIP frame holds "
            f"at most {MAX_U32}",
        )
    head = HEADER.pack(VERSION, Kind.INFERENCE, Subtype.RESPONSE, 0, remaining)
    return b"".join([head, INFER_HEADER.pack(n_input, n_output, batch_size), *items])


def encode_header(kind: int, subtype: int, remaining: int = 0) -> bytes:
    return HEADER.pack(VERSION, kind, subtype, 0, remaining)


def encode_error(code: ErrorCode, message: str = "") -> bytes:
    """An error frame: kind 0, the error code as subtype, the message as payload."""
    text = message.encode("utf-8", "replace")[:MAX_MESSAGE_BYTES]
    return encode_header(Kind.ERROR, code, len(text)) + text


def check_request(header: Header) -> MipError | None:
    """Return the error a well-framed request header earns, if any.

    SPEC: PROTOCOL-FACTS §4.2 — the subtype is checked before the kind.
    """
    if header.subtype != Subtype.REQUEST:
        return MipError(
            ErrorCode.SUBTYPE,
            f"a request must have subtype 0 (request), got {header.subtype}",
        )
    if header.kind not in (Kind.PING, Kind.INFERENCE):
        return MipError(
            ErrorCode.METHOD,
            f"kind {header.kind} is not served; the kinds are 1 (ping) and 2 (inference)",
        )
    return None


PONG = encode_header(Kind.PING, Subtype.RESPONSE)
