"""One request on an HTTP/1.1 connection and its reply: the ASGI receive and send.

The connection (http11.py) makes an :class:`Exchange` when a request's head
is in and runs it as a task; the app (falcon) takes the body through
``receive`` and answers through ``send``, which frames the reply
(Content-Length or chunked, HEAD, ``Connection: close``) and tells the
connection when it is complete, so the next pipelined request can start.

Compiled with the request path (appliance/native.py).
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger("appliance.http")

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
CLIENT_LEFT = "the client closed the connection"

# SPEC: RFC 9110 §5.1 (a field name is a token), §5.5 (a field value holds
# no control character but HTAB).
_BAD_NAME = re.compile(b'[\x00-\x20\x7f()<>@,;:\\\\"/\\[\\]?={}]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def _status_line(code: int) -> bytes:
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {code} {phrase}\r\n".encode("latin-1")


STATUS_LINES = {code: _status_line(code) for code in range(100, 600)}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


_SERVER_ERROR = [
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"21"),
    (b"connection", b"close"),
]


class Connection(Protocol):
    """What an exchange uses of its connection (http11.Connection)."""

    transport: Any
    loop: asyncio.AbstractEventLoop
    server_state: Any
    write_paused: bool

    async def drain(self) -> None: ...

    def resume_reading_for(self, exchange: Exchange) -> None: ...

    def on_response_complete(self) -> None: ...


class Exchange:
    """One request on a connection and its reply: what the app's receive and send see."""

    def __init__(
        self, connection: Connection, scope: dict[str, Any], keep_alive: bool, expect: bool
    ) -> None:
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.waiting_for_continue = expect
        self.head = scope["method"] == "HEAD"
        # The body arrived and not yet given to the app.
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.more_body = True
        self.body_given = False
        # The app's receives waiting for body or for the end (a disconnect watcher
        # may wait beside a body read): each its own future, so one cancelled
        # leaves the others waiting.
        self.waiters: list[asyncio.Future[None]] = []
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.finished = False
        # The reply's framing: -1 not known yet, 0 Content-Length, 1 chunked.
        self.chunked = -1
        self.length_left = 0
        # The reply's head, held to go out with its body (Content-Length framing).
        self.held = b""

    def wake(self) -> None:
        if self.waiters:
            waiters, self.waiters = self.waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def run(self, app: App) -> None:
        """Run the app on this request, and make sure the client gets an answer."""
        try:
            await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError as ex:
            if ex.args != (CLIENT_LEFT,):
                raise
        except BaseException as ex:
            log.error("the HTTP app failed on a request", exc_info=ex)
            await self._end_unanswered()
        else:
            if not self.response_complete and not self.disconnected:
                if self.response_started:
                    log.error("the HTTP app returned without finishing its answer")
                else:
                    log.error("the HTTP app returned without answering a request")
                await self._end_unanswered()
        finally:
            self.finished = True

    async def _end_unanswered(self) -> None:
        """End a request the app did not answer in full: with a 500 while the client
        has had no byte of the reply (a head held for its body is dropped), else by
        closing the connection."""
        if self.held:
            self.held = b""
            self.response_started = False
        if self.response_started:
            self.connection.transport.close()
        else:
            await self._answer_500()

    async def _answer_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _SERVER_ERROR})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> dict[str, Any]:
        connection = self.connection
        if self.waiting_for_continue and not connection.transport.is_closing():
            connection.transport.write(_CONTINUE)
            self.waiting_for_continue = False
        if not self.disconnected and not self.response_complete:
            connection.resume_reading_for(self)
            if not self.body and (self.more_body or self.body_given):
                # Wait for more of the body, or (all given) for the end.
                waiter = connection.loop.create_future()
                self.waiters.append(waiter)
                await waiter
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self.body_bytes = 0
        if not self.more_body:
            self.body_given = True
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        connection = self.connection
        if connection.write_paused and not self.disconnected:
            await connection.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self._start_response(message["status"], message.get("headers", ()))
            return
        if self.response_complete:
            raise RuntimeError(f"ASGI message {kind!r} sent after the response was complete")
        if kind != "http.response.body":
            raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
        more = bool(message.get("more_body", False))
        self._write_body(message.get("body", b""), more)
        if not more:
            self._complete()

    def _write_body(self, body: Any, more: bool) -> None:
        transport = self.connection.transport
        if self.held:
            self._write_held(body)
            body = b""
        if self.head:
            self.length_left = 0
        elif self.chunked == 1:
            if body:
                transport.write(b"%x\r\n%b\r\n" % (len(body), body))
            if not more:
                transport.write(b"0\r\n\r\n")
        elif body:
            self._count(len(body))
            transport.write(body)

    def _complete(self) -> None:
        if self.length_left != 0:
            raise RuntimeError("response content shorter than its Content-Length")
        self.response_complete = True
        self.wake()
        if not self.keep_alive:
            self.connection.transport.close()
        if not self.finished:
            self.connection.on_response_complete()

    def _count(self, size: int) -> None:
        if size > self.length_left:
            raise RuntimeError("response content longer than its Content-Length")
        self.length_left -= size

    def _write_held(self, body: Any) -> None:
        """The held head, with the first part of a Content-Length reply's body.

        PERF: one write (one send, one segment the client wakes for) where the
        head and the body took two.
        """
        held, self.held = self.held, b""
        if body and not self.head:
            self._count(len(body))
            held += body
        self.connection.transport.write(held)

    def _start_response(self, status: int, headers: Any) -> None:
        self.waiting_for_continue = False
        # Framing from these headers alone: a start refused below (a bad
        # header) is followed by the 500's.
        self.chunked = -1
        self.length_left = 0
        connection = self.connection
        lines = [STATUS_LINES[status]]
        closing = False
        for name, value in (*connection.server_state.default_headers, *headers):
            if _BAD_NAME.search(name) is not None:
                raise RuntimeError("invalid HTTP header name")
            if _BAD_VALUE.search(value) is not None:
                raise RuntimeError("invalid HTTP header value")
            name = name.lower()
            if name == b"content-length" and self.chunked == -1:
                self.length_left = int(value.decode())
                self.chunked = 0
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.length_left = 0
                self.chunked = 1
            elif name == b"connection" and _says_close(value):
                self.keep_alive = False
                closing = True
            lines.append(b"%b: %b\r\n" % (name, value))
        if not self.keep_alive and not closing:
            lines.append(b"connection: close\r\n")
        if self.chunked == -1 and not self.head and status not in (204, 304):
            # Neither a length nor chunked framing given: chunked.
            self.chunked = 1
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        self.response_started = True
        if self.chunked == 0 and self.length_left:
            # Its body follows at once (falcon sends it next): they go together.
            self.held = b"".join(lines)
        else:
            connection.transport.write(b"".join(lines))


def _says_close(value: bytes) -> bool:
    return b"close" in [token.strip().lower() for token in value.split(b",")]
