"""The HTTP worker's HTTP/1.1 connection: httptools (llhttp) parsing, ASGI to falcon.

One :class:`Connection` per client connection, made by uvicorn's server (the
worker class, httpworker.py) in the worker's uvloop loop; one
:class:`Exchange` per request on it, run as a task: the ASGI ``receive`` and
``send`` the app is given. Keep-alive, pipelining (a request that arrives
while the one before it is answered waits, reading paused), ``Expect:
100-continue``, chunked bodies both ways, HEAD, and flow control both ways
(reading pauses while a request's unread body passes BODY_HIGH_WATER_BYTES;
a reply waits while the client is not reading).

The appliance's limits (the worker's settings, :class:`Limits`):

- A request's head (request line and headers), and a body up to
  ``BODY_DEADLINE_BYTES`` declared by Content-Length, must arrive within
  ``http.read_timeout_s`` of the connection opening (or of the first byte of
  a keep-alive connection's next request, or, for a request pipelined
  behind another, of that one's answer); else the connection is closed.
  Each wait for bytes of a larger (or chunked) body is bounded by
  ``http.io_timeout_s``, and an idle keep-alive connection is closed after
  the keep-alive time.
- A request head still unfinished after ``HEAD_LIMIT_BYTES`` is answered
  431 and the connection closed: the parser would buffer it all.
- A client that stops reading its reply for ``http.io_timeout_s`` is cut
  off, so an unread reply does not stay in memory.
- A request whose client has gone is cancelled DISCONNECT_GRACE_S after.
- No Server header is sent, no proxy header is trusted, and no access line
  is written here (the app's observer does, ``frontends/observe_http.py``).

PERF: compiled with the request path (appliance/native.py). uvicorn's
connection and request cycle ran some 1,200 bytecodes a keep-alive request
(bench/results, issue 55); the connection keeps one clock for its read
deadlines, moved by a float per request, where a timer was armed and
cancelled twice a request.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections import deque
from typing import Any

import httptools

from appliance.frontends.descriptors import Descriptors
from appliance.frontends.http_exchange import CLIENT_LEFT, STATUS_LINES, App, Exchange

log = logging.getLogger("appliance.http")

# Bodies up to this size must arrive within http.read_timeout_s; larger ones
# may take longer, each wait for more bytes bounded by http.io_timeout_s.
BODY_DEADLINE_BYTES = 1 << 20
# The most a request line and its headers may take; httptools keeps no limit
# of its own. Far above any client's (tritonclient, requests, browsers send
# under 2 KiB), far below what would matter to a worker's memory.
HEAD_LIMIT_BYTES = 64 << 10
# Reading pauses while a request holds this much body its app has not taken.
BODY_HIGH_WATER_BYTES = 64 << 10
# A request whose client has gone is cancelled this long after (gunicorn's
# asgi_disconnect_grace_period): a streamed reply (GRPS) would otherwise keep
# its model streaming into a closed connection.
DISCONNECT_GRACE_S = 3.0

# What the read clock waits for (Connection._read_why).
_NOTHING, _HEAD, _BODY, _IDLE = 0, 1, 2, 3


def _plain_answer(code: int, text: str) -> bytes:
    """A whole reply that closes the connection: for what never reaches the app."""
    body = text.encode()
    return (
        STATUS_LINES[code]
        + b"content-type: text/plain; charset=utf-8\r\n"
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


_BAD_REQUEST = _plain_answer(400, "Invalid HTTP request received.")
_HEAD_TOO_LARGE = _plain_answer(
    431, f"the request line and headers exceed {HEAD_LIMIT_BYTES} bytes"
)


class Limits:
    """The worker's settings for its connections (http.* and gunicorn's keepalive)."""

    def __init__(
        self,
        read_timeout_s: float,
        io_timeout_s: float,
        keepalive_s: float,
        descriptors: Descriptors | None,
    ) -> None:
        self.read_timeout_s = read_timeout_s
        self.io_timeout_s = io_timeout_s
        self.keepalive_s = keepalive_s
        self.descriptors = descriptors


def _address(info: Any) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


class Connection:
    """One client connection: the protocol uvloop feeds, and its requests.

    Made by uvicorn's server as its protocol class was
    (``functools.partial(Connection, limits=...)``).
    """

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        limits: Limits | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app: App = config.loaded_app
        self.loop: asyncio.AbstractEventLoop = _loop or asyncio.get_event_loop()
        self.limits = limits or Limits(30.0, 60.0, float(config.timeout_keep_alive), None)
        self.server_state = server_state
        self.app_state = app_state
        self.parser: Any = httptools.HttpRequestParser(self)
        # Answer the request before a closing one's pipelined successor is refused.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: Any = None
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.admitted = False
        # The request being read (headers arriving, or its body) and the one answered.
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_continue = False
        self.reading: Exchange | None = None
        self.current: Exchange | None = None
        self.pipeline: deque[Exchange] = deque()
        self.task: asyncio.Task[None] | None = None
        # Flow control.
        self.read_paused = False
        self.write_paused = False
        self.writable: asyncio.Future[None] | None = None
        # The read clock: what the connection waits for from the client, and by when.
        self.read_why = _NOTHING
        self.read_due = 0.0
        self.clock: asyncio.TimerHandle | None = None
        self.clock_at = 0.0
        self.stalled: asyncio.TimerHandle | None = None
        # A request has begun whose head (and body, if small) is not all in.
        self.arriving = False
        # Bytes fed while no request head was complete: a head being sent.
        self.head_open = True
        self.head_bytes = 0
        self.completed = False

    # -- the transport's calls ---------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        descriptors = self.limits.descriptors
        if descriptors is not None and not descriptors.admit():
            transport.close()
            return
        self.admitted = True
        self.transport = transport
        self.server_state.connections.add(self)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"
        self._wait_for(_HEAD, self.limits.read_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        self.server_state.connections.discard(self)
        descriptors = self.limits.descriptors
        if descriptors is not None:
            descriptors.closed()
        for exchange in (self.current, self.reading, *self.pipeline):
            if exchange is not None and not exchange.response_complete:
                exchange.disconnected = True
                exchange.wake()
        self.pipeline.clear()
        task = self.task
        if task is not None and not task.done():
            self.loop.call_later(DISCONNECT_GRACE_S, task.cancel, CLIENT_LEFT)
        self.read_why = _NOTHING
        if self.clock is not None:
            self.clock.cancel()
            self.clock = None
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None
        self._writable_again()
        if exc is None:
            self.transport.close()
        self.parser = None

    def eof_received(self) -> None:
        return None

    def data_received(self, data: bytes) -> None:
        if self.read_why == _BODY:
            self.read_due = self.loop.time() + self.limits.io_timeout_s
        self.completed = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # No upgrade is served (no WebSocket route): the request is answered
            # as it is, and what follows its head is not HTTP to parse.
            pass
        except httptools.HttpParserError:
            log.debug("closing a connection that sent a request HTTP cannot parse")
            self._close_with(_BAD_REQUEST)
            return
        # Counted after the parser had them, and only where no request ended
        # in them: bytes that completed a head or a request are not a head
        # too large. So a head may run one read (256 KiB) past the limit.
        if self.head_open and not self.completed:
            self.head_bytes += len(data)
            if self.head_bytes > HEAD_LIMIT_BYTES and not self.transport.is_closing():
                self._close_with(_HEAD_TOO_LARGE)

    def pause_writing(self) -> None:
        # The client stopped reading its reply: it gets io_timeout_s to go on.
        self.write_paused = True
        if self.stalled is None:
            self.stalled = self.loop.call_later(self.limits.io_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None
        self._writable_again()

    def shutdown(self) -> None:
        """The server stops: close when idle, else after the reply in progress."""
        current = self.current
        if current is None or current.response_complete:
            if self.transport is not None:
                self.transport.close()
        else:
            current.keep_alive = False

    # -- the parser's calls ------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect_continue = False
        self.arriving = True
        # One pipelined behind a request still being answered gets its
        # deadline from that answer on (on_response_complete).
        current = self.current
        if current is None or current.response_complete:
            self._wait_for(_HEAD, self.limits.read_timeout_s)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_open = False
        parser = self.parser
        version = parser.get_http_version()
        # Any: the stubs say bytes where a URL without a query has None.
        url: Any = httptools.parse_url(self.url)
        raw_path: bytes = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": "",
            "headers": self.headers,
            "state": self.app_state.copy(),
            "method": parser.get_method().decode("ascii"),
            "path": path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
        }
        keep_alive = version != "1.0" and bool(parser.should_keep_alive())
        exchange = Exchange(self, scope, keep_alive, self.expect_continue)
        self.reading = exchange
        small = self._small_body()
        if not small:
            self.arriving = False
            self._wait_for(_BODY, self.limits.io_timeout_s)
        current = self.current
        if current is None or current.response_complete:
            self._start(exchange)
        else:
            # Pipelined: answered after the one before it.
            self._pause_reading()
            self.pipeline.append(exchange)

    def on_body(self, body: bytes) -> None:
        exchange = self.reading
        if exchange is None or exchange.response_complete:
            return
        exchange.body.append(body)
        exchange.body_bytes += len(body)
        if exchange.body_bytes > BODY_HIGH_WATER_BYTES:
            self._pause_reading()
        exchange.wake()

    def on_message_complete(self) -> None:
        self.arriving = False
        self.completed = self.head_open = True
        self.head_bytes = 0
        self.read_why = _NOTHING
        exchange = self.reading
        self.reading = None
        if exchange is None or exchange.response_complete:
            # The rest of a body its request's answer did not wait for.
            self._wait_if_idle()
            return
        exchange.more_body = False
        exchange.wake()

    # -- requests ------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self.current = exchange
        task = self.loop.create_task(exchange.run(self.app))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        self.task = task

    def on_response_complete(self) -> None:
        """The current request is answered: the next one pipelined starts, or the
        connection waits for one."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._resume_reading()
        if self.pipeline:
            self._start(self.pipeline.popleft())
        if self.arriving:
            self._wait_for(_HEAD, self.limits.read_timeout_s)
        else:
            self._wait_if_idle()

    def _wait_if_idle(self) -> None:
        """Nothing arriving and the last request answered: wait keepalive_s for the next."""
        current = self.current
        if self.reading is None and current is not None and current.response_complete:
            self._wait_for(_IDLE, self.limits.keepalive_s)

    def _small_body(self) -> bool:
        for name, value in self.headers:
            if name == b"content-length":
                return value.isdigit() and int(value) <= BODY_DEADLINE_BYTES
            if name == b"transfer-encoding":
                return False
        return True

    # -- flow control --------------------------------------------------------------

    def _pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def resume_reading_for(self, exchange: Exchange) -> None:
        """The app takes ``exchange``'s body: read on, unless a pipelined request waits."""
        if self.read_paused and exchange is self.current and not self.pipeline:
            self._resume_reading()

    async def drain(self) -> None:
        """Wait until the client reads again."""
        if self.writable is None or self.writable.done():
            self.writable = self.loop.create_future()
        await self.writable

    def _writable_again(self) -> None:
        self.write_paused = False
        writable = self.writable
        self.writable = None
        if writable is not None and not writable.done():
            writable.set_result(None)

    # -- the read clock ------------------------------------------------------------

    def _wait_for(self, why: int, seconds: float) -> None:
        """Close the connection unless what ``why`` names comes within ``seconds``.

        One timer at most: moving the due time later needs none of its own (a
        timer that rings early looks again at the time then due); only a due
        time earlier than the timer's sets it again.
        """
        self.read_why = why
        due = self.loop.time() + seconds
        self.read_due = due
        clock = self.clock
        if clock is None or self.clock_at > due:
            if clock is not None:
                clock.cancel()
            self.clock = self.loop.call_at(due, self._clock_rang)
            self.clock_at = due

    def _clock_rang(self) -> None:
        self.clock = None
        why = self.read_why
        if why == _NOTHING or self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if why == _BODY and self.read_paused:
            # The app has not taken the bytes it has: the client cannot be
            # blamed for waiting.
            self.read_due = now + self.limits.io_timeout_s
        if now < self.read_due:
            self.clock = self.loop.call_at(self.read_due, self._clock_rang)
            self.clock_at = self.read_due
            return
        if why == _HEAD:
            log.debug("closing a connection whose request did not arrive in time")
        elif why == _BODY:
            log.debug("closing a connection whose request body stopped arriving")
        self.read_why = _NOTHING
        self.transport.close()

    def _write_timed_out(self) -> None:
        self.stalled = None
        log.debug("closing a connection whose client stopped reading its reply")
        self.transport.abort()

    def _close_with(self, answer: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()
