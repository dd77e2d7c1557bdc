"""Types, the failure guard and the body reader shared by the protocols' REST bindings.

The HTTP frontend is an asyncio (ASGI) app: one event loop per worker, so a
request waiting on a model holds no thread. A responder is either a
coroutine (inference, which waits through the model client's asyncio
channel) or plain blocking code, which :func:`blocking` runs on the worker's
thread pool (``http.threads``). Bodies are read in the loop before any
responder runs (:class:`ReadAhead`), so blocking code never reads the socket.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import falcon
import falcon.asgi

from appliance.errors import BadRequest, TooLarge
from appliance.protocols.threads import Threads

# The falcon app every protocol's REST routes mount into.
App = falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response]

LIMIT_KEY = "http.max_body_bytes"

Responder = Callable[..., Any]
AsyncResponder = Callable[..., Awaitable[None]]
# Renders any exception a responder raised in its protocol's error form.
RenderFailure = Callable[[falcon.Request, falcon.Response, Exception], None]


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


def blocking(responder: Responder) -> AsyncResponder:
    """Make a blocking responder a coroutine that runs it on the pool."""

    @functools.wraps(responder)
    async def wrapper(self: Any, req: falcon.Request, resp: falcon.Response, **params: Any) -> None:
        threads: Threads = req.context.threads
        context = contextvars.copy_context()
        # The access line names the model the thread called: the observer
        # (frontends/observe.py) reads it from the thread's context.
        req.context.call_context = context
        run = functools.partial(responder, self, req, resp, **params)
        await threads.call_in(context, run)

    return wrapper


def guarded(render: RenderFailure) -> Callable[[Responder], AsyncResponder]:
    """Decorate responders so that every failure is answered by ``render``.

    No exception leaves a responder: falcon would answer it with its own
    error body, which no protocol's client understands, and log a traceback
    per request. ``render`` logs the unexpected ones itself. A blocking
    responder runs on the pool (see :func:`blocking`).
    """

    def decorate(responder: Responder) -> AsyncResponder:
        run = responder if inspect.iscoroutinefunction(responder) else blocking(responder)

        @functools.wraps(responder)
        async def wrapper(
            self: Any, req: falcon.Request, resp: falcon.Response, **params: Any
        ) -> None:
            try:
                await run(self, req, resp, **params)
            except Exception as ex:
                render(req, resp, ex)

        return wrapper

    return decorate


def send_events(resp: Any, events: AsyncIterator[falcon.asgi.SSEvent]) -> None:
    """Answer with ``events`` as server-sent events (text/event-stream).

    falcon's ASGI response sends them as they come; it stops at the first event
    after the client has gone, and the generator is closed when dropped.
    """
    resp.sse = events


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
