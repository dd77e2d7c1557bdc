"""MIP framing: the fixed 8-byte header, pure bytes in and out.

SPEC: specs/mip.md and PROTOCOL-FACTS §4.1. All fields are big-endian::

    +---------+------+---------+----------+------------------------+
    | version | kind | subtype | reserved | remaining size (u32)   |
    | u8 = 0  | u8   | u8      | u8 = 0   | bytes of payload after |
    +---------+------+---------+----------+------------------------+
"""

from __future__ import annotations

import enum
import struct

HEADER = struct.Struct("!4BL")
VERSION = 0


class Kind(enum.IntEnum):
    ERROR = 0
    PING = 1
    INFERENCE = 2


class Subtype(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1


class ErrorCode(enum.IntEnum):
    PROTOCOL = 0
    SUBTYPE = 1
    METHOD = 2
    MEMORY = 3
    SHAPE = 4
    INTERNAL = 5


def decode_header(data: bytes) -> tuple[int, int, int, int]:
    """Return (version, kind, subtype, remaining size) of an 8-byte header."""
    version, kind, subtype, _reserved, remaining = HEADER.unpack(data)
    return version, kind, subtype, remaining


def encode_header(kind: int, subtype: int, remaining: int = 0) -> bytes:
    return HEADER.pack(VERSION, kind, subtype, 0, remaining)


def encode_error(code: ErrorCode) -> bytes:
    """An error frame: kind 0, the error code as subtype, no payload."""
    return encode_header(Kind.ERROR, code)


PONG = encode_header(Kind.PING, Subtype.RESPONSE)
