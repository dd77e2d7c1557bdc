"""A request buffer for the HTTP worker that hands out bytes without copying the rest.

gunicorn's ``Unreader`` copies everything it buffers on each ``read()`` and
``unread()``, and its body reader takes 1 KiB per call: harmless while the
buffer holds one socket chunk, quadratic once the worker's poller has read a
whole request body ahead into it (a 1 MiB body took 40 ms to reach the app,
about 2 GB copied). This one keeps the bytes in a bytearray with a read
position: a read hands out at most ``PIECE`` buffered bytes, and an unread of
what was just handed out (all gunicorn ever unreads) moves the position back.
"""

from __future__ import annotations

from typing import Any

from gunicorn.http.unreader import SocketUnreader

# As much as gunicorn's body reader asks for at a time: a read then leaves
# nothing to unread.
PIECE = 1024
# Consumed bytes are dropped from the front once there are this many.
COMPACT_BYTES = 64 * 1024


class BufferedUnreader(SocketUnreader):  # type: ignore[misc]
    """gunicorn's socket unreader over a bytearray with a read position."""

    def __init__(self, sock: Any, max_chunk: int = 8192) -> None:
        super().__init__(sock, max_chunk)
        self._pending = bytearray()
        self._pos = 0

    @property
    def buffered(self) -> int:
        """Bytes read from the socket and not yet handed out."""
        return len(self._pending) - self._pos

    def feed(self, data: bytes) -> None:
        """Append bytes read from the socket (by the worker's poller)."""
        if self._pos >= COMPACT_BYTES:
            del self._pending[: self._pos]
            self._pos = 0
        self._pending += data

    def head(self, size: int) -> bytes:
        """A copy of the first ``size`` bytes not yet handed out."""
        return bytes(self._pending[self._pos : self._pos + size])

    def tail(self, size: int) -> bytes:
        """A copy of the last ``size`` bytes not yet handed out."""
        return bytes(self._pending[max(self._pos, len(self._pending) - size) :])

    def read(self, size: int | None = None) -> bytes:
        if size is not None and not isinstance(size, int):
            raise TypeError("size parameter must be an int or long.")
        if size == 0:
            return b""
        if size is None or size < 0:
            if self.buffered:
                return self._take(PIECE)
            data: bytes = self.chunk()
            return data
        while self.buffered < size:
            chunk = self.chunk()
            if not chunk:
                return self._take(self.buffered)
            self.feed(chunk)
        return self._take(size)

    def unread(self, data: bytes) -> None:
        count = len(data)
        if not count:
            return
        if count <= self._pos:
            with memoryview(self._pending) as view:
                same = view[self._pos - count : self._pos] == data
            if same:
                self._pos -= count
                return
        self._pending = bytearray(data) + self._pending[self._pos :]
        self._pos = 0

    def _take(self, size: int) -> bytes:
        end = min(self._pos + size, len(self._pending))
        data = bytes(self._pending[self._pos : end])
        self._pos = end
        return data
