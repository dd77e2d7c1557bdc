"""Request bodies for the protocols' REST bindings: read ahead in the loop, then taken.

The HTTP frontend reads each request's body in its event loop before any
responder runs (:class:`ReadAhead`, falcon middleware), so a blocking
responder on the pool never reads the socket; a responder takes it with
:func:`read_body`, which refuses one over ``http.max_body_bytes``.

Compiled with the request path (appliance/native.py).
"""

from __future__ import annotations

import falcon
import falcon.asgi

from appliance.errors import BadRequest, TooLarge
from appliance.protocols.threads import Threads

LIMIT_KEY = "http.max_body_bytes"


class ReadAhead:
    """falcon middleware: read each request's body, and hand responders the pool.

    A body over ``limit`` by its Content-Length is left unread (the route
    refuses it with 413, see :func:`read_body`); a chunked one is read up
    to one byte past the limit.
    """

    def __init__(self, limit: int, threads: Threads) -> None:
        self.limit = limit
        self.threads = threads

    async def process_request(self, req: falcon.asgi.Request, _resp: falcon.Response) -> None:
        req.context.threads = self.threads
        req.context.body = await _read_ahead(req, self.limit)


async def _read_ahead(req: falcon.asgi.Request, limit: int) -> bytes | None:
    try:
        length = req.content_length
    except falcon.HTTPError:
        return None  # read_body answers it
    if length == 0:
        return b""
    if length is not None:
        if length > limit:
            return None  # refused unread by read_body
        data: bytes = await req.stream.read(length)
        return data
    # Without a length or chunked framing an HTTP/1.1 request has no body.
    if "chunked" not in (req.get_header("Transfer-Encoding") or "").lower():
        return b""
    chunks = []
    size = 0
    async for chunk in req.stream:
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)


def read_body(req: falcon.Request, limit: int, hint: str = "") -> bytes:
    """Return the whole request body, refusing one over ``limit`` bytes.

    A Content-Length over the limit is refused before a byte of the body is
    read; a chunked body is read up to one byte past the limit. The server
    then discards the unread rest or closes the connection.

    Args:
        req: the request.
        limit: the largest body accepted (``http.max_body_bytes``).
        hint: appended to the error message (what to do instead).

    Raises:
        TooLarge: the body is larger than ``limit``.
        BadRequest: the Content-Length header is not a byte count.
    """
    try:
        length = req.content_length
    except falcon.HTTPError:
        raise BadRequest("the Content-Length header is not a byte count") from None
    if length is not None and length > limit:
        raise TooLarge(too_large_message(length, limit, hint))
    data: bytes | None = getattr(req.context, "body", None)
    if data is None:
        # Left unread by ReadAhead: over the frontend's limit.
        raise TooLarge(too_large_message(length, limit, hint))
    if len(data) > limit:
        raise TooLarge(too_large_message(None, limit, hint))
    return data


def too_large_message(length: int | None, limit: int, hint: str = "") -> str:
    """The 413 message: the body's size when known, the limit and its key."""
    size = f"of {length} bytes " if length is not None else ""
    text = f"the request body {size}exceeds the limit of {limit} bytes ({LIMIT_KEY})"
    return f"{text}; {hint}" if hint else text
