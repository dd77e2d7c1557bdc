"""Types, the failure guard and the body reader shared by the protocols' REST bindings."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import falcon

from appliance.errors import BadRequest, TooLarge

# The falcon app every protocol's REST routes mount into.
App = falcon.App[falcon.Request, falcon.Response]

LIMIT_KEY = "http.max_body_bytes"

Responder = Callable[..., None]
# Renders any exception a responder raised in its protocol's error form.
RenderFailure = Callable[[falcon.Request, falcon.Response, Exception], None]


def guarded(render: RenderFailure) -> Callable[[Responder], Responder]:
    """Decorate responders so that every failure is answered by ``render``.

    No exception leaves a responder: falcon would answer it with its own
    error body, which no protocol's client understands, and log a traceback
    per request. ``render`` logs the unexpected ones itself.
    """

    def decorate(responder: Responder) -> Responder:
        @functools.wraps(responder)
        def wrapper(self: Any, req: falcon.Request, resp: falcon.Response, **params: Any) -> None:
            try:
                responder(self, req, resp, **params)
            except Exception as ex:
                render(req, resp, ex)

        return wrapper

    return decorate


def read_body(req: falcon.Request, limit: int, hint: str = "") -> bytes:
    """Return the whole request body, refusing one over ``limit`` bytes.

    A Content-Length over the limit is refused before a byte of the body is
    read; a chunked body is read up to one byte past the limit. gunicorn
    then discards the unread rest (bounded in time and bytes) or closes the
    connection.

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
    if length is not None:
        if length > limit:
            raise TooLarge(too_large_message(length, limit, hint))
        data: bytes = req.bounded_stream.read(length)
        return data
    # Without a length or chunked framing an HTTP/1.1 request has no body;
    # a chunked one ends where gunicorn ends wsgi.input.
    if "chunked" not in (req.get_header("Transfer-Encoding") or "").lower():
        return b""
    data = req.stream.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(too_large_message(None, limit, hint))
    return data


def too_large_message(length: int | None, limit: int, hint: str = "") -> str:
    """The 413 message: the body's size when known, the limit and its key."""
    size = f"of {length} bytes " if length is not None else ""
    text = f"the request body {size}exceeds the limit of {limit} bytes ({LIMIT_KEY})"
    return f"{text}; {hint}" if hint else text
