"""A small blocking MIP client that speaks our TENSOR items too.

KubeMo's own client opens a connection per call and knows TEXT, JSON and
IMAGE only; this one keeps its connection open, can pipeline (``send`` several
requests, then ``receive`` the replies in order) and sends numpy arrays as
TENSOR items. Tests and the benchmark use it; so can users.

Example:
    >>> with MipClient("127.0.0.1", 8002) as mip:
    ...     mip.ping()
    ...     [[out]] = mip.infer([[tensor_item(np.ones(4, np.float32))]])
    ...     decode_item(out)
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from appliance.protocols.mip import codec, items
from appliance.protocols.mip.codec import HEADER, INFER_HEADER, ITEM_HEADER, Kind, Subtype

Array = npt.NDArray[Any]
# An item as this client handles it: its type and its data (replies hold
# views into the received frame).
Pair = tuple[codec.ItemType, bytes | memoryview]
Built = tuple[codec.ItemType, bytes]


class MipReplyError(Exception):
    """The server answered with an error frame."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"MIP error {code}: {message}")
        self.code = code
        self.message = message


def tensor_item(array: npt.ArrayLike) -> Built:
    """Return a TENSOR item holding ``array``."""
    return codec.ItemType.TENSOR, b"".join(items.encode_tensor(np.asarray(array)))


def text_item(text: str) -> Built:
    return codec.ItemType.TEXT, text.encode()


def json_item(value: Any) -> Built:
    return codec.ItemType.JSON, orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_item(item: Pair) -> Any:
    """Return an item's value: an array (TENSOR), parsed JSON, str or bytes."""
    item_type, data = item
    if item_type is codec.ItemType.TENSOR:
        return items.decode_tensor(memoryview(data).cast("B"), "reply item")
    if item_type is codec.ItemType.JSON:
        return orjson.loads(data)
    if item_type is codec.ItemType.TEXT:
        return bytes(data).decode()
    return bytes(data)


def encode_request(batch: Sequence[Sequence[Pair]]) -> bytes:
    """Return an inference request frame for a batch of item lists."""
    n_input = len(batch[0]) if batch else 0
    parts: list[bytes | memoryview] = [b"", INFER_HEADER.pack(n_input, 0, len(batch))]
    for element in batch:
        for item_type, data in element:
            parts += [ITEM_HEADER.pack(item_type, len(data)), data]
    size = sum(len(part) for part in parts)
    parts[0] = HEADER.pack(codec.VERSION, Kind.INFERENCE, Subtype.REQUEST, 0, size)
    return b"".join(parts)


class MipClient:
    """One persistent MIP connection."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __enter__(self) -> MipClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def ping(self) -> None:
        """Send a ping; raise MipReplyError unless the server answers pong."""
        self.sock.sendall(HEADER.pack(codec.VERSION, Kind.PING, Subtype.REQUEST, 0, 0))
        self.receive()

    def infer(self, batch: Sequence[Sequence[Pair]]) -> list[list[Pair]]:
        """Send one inference request and return its output items per element."""
        self.send(batch)
        return self.receive_outputs()

    def send(self, batch: Sequence[Sequence[Pair]]) -> None:
        self.sock.sendall(encode_request(batch))

    def receive(self) -> tuple[codec.Header, memoryview]:
        """Read one reply frame; raise MipReplyError for an error frame."""
        header = codec.decode_header(self._read(HEADER.size))
        payload = self._read(header.remaining)
        if header.kind == Kind.ERROR:
            raise MipReplyError(header.subtype, bytes(payload).decode(errors="replace"))
        return header, payload

    def receive_outputs(self) -> list[list[Pair]]:
        """Read one inference reply; return its items per batch element."""
        _header, payload = self.receive()
        _n_input, n_output, batch = INFER_HEADER.unpack_from(payload)
        offset = INFER_HEADER.size
        elements = []
        for _element in range(batch):
            row: list[Pair] = []
            for _output in range(n_output):
                item_type, length = ITEM_HEADER.unpack_from(payload, offset)
                offset += ITEM_HEADER.size
                row.append((codec.ItemType(item_type), payload[offset : offset + length]))
                offset += length
            elements.append(row)
        return elements

    def _read(self, count: int) -> memoryview:
        view = memoryview(bytearray(count))
        got = 0
        while got < count:
            received = self.sock.recv_into(view[got:])
            if not received:
                raise ConnectionError(f"the server closed the connection after {got} of {count}")
            got += received
        return view
