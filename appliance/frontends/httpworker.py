"""A gunicorn worker class: uvicorn's (uvloop, httptools), with the appliance's limits.

gunicorn stays the process manager (its arbiter holds the master's listening
socket, forks the workers and replaces dead ones); each worker is one uvloop
loop (``server.event_loop``) running uvicorn's HTTP/1.1 protocol on the
httptools (llhttp) parser. Against gunicorn's own ASGI worker it costs about
half the server CPU per new connection and up to a third less per keep-alive
request (bench/profiles/README.md, "The HTTP stack"). A request waiting on a
model holds no thread, and a slow client holds only its connection. What the
appliance adds to uvicorn's worker:

- A request's headers, and a body up to ``BODY_DEADLINE_BYTES`` declared by
  Content-Length, must arrive within ``http.read_timeout_s`` of the
  connection opening (or of the first byte of a keep-alive connection's next
  request, or, for a request pipelined behind another, of that one's
  answer); else the connection is closed. Each wait for bytes of a larger
  (or chunked) body is bounded by ``http.io_timeout_s``.
- A request head (request line and headers) still unfinished after
  ``HEAD_LIMIT_BYTES`` is answered 431 and the connection closed: the
  parser would buffer it all.
- A client that stops reading its reply for ``http.io_timeout_s`` is cut
  off, so an unread reply does not stay in memory.
- On SIGTERM the worker stops accepting at once (the master's socket keeps
  queueing connections for the other workers or the next arbiter), closes
  its idle keep-alive connections and finishes the requests in flight, then
  exits normally, so gunicorn's ``worker_exit`` hook runs.
- The kernel sends the worker SIGTERM when its arbiter dies (PR_SET_PDEATHSIG).
- TLS is gunicorn's own context (``gunicorn.sock.ssl_context``); no proxy
  headers are trusted, no Server header is sent, and uvicorn writes no access
  lines (the app's observer does, ``frontends/observe.py``).

Configured as ``appliance.frontends.httpworker.HttpWorker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from typing import Any

from gunicorn import sock as gunicorn_sock
from gunicorn.arbiter import Arbiter
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from appliance.frontends.descriptors import Descriptors
from appliance.processes.lifetime import die_with_parent

# Bodies up to this size must arrive within http.read_timeout_s; larger ones
# may take longer, each wait for more bytes bounded by http.io_timeout_s.
BODY_DEADLINE_BYTES = 1 << 20
# The most a request line and its headers may take; httptools keeps no limit
# of its own. Far above any client's (tritonclient, requests, browsers send
# under 2 KiB), far below what would matter to a worker's memory.
HEAD_LIMIT_BYTES = 64 << 10
# A request whose client has gone is cancelled this long after (gunicorn's
# asgi_disconnect_grace_period): uvicorn would let it run on, and a streamed
# reply (GRPS) would keep its model streaming into a closed connection.
DISCONNECT_GRACE_S = 3.0
CLIENT_LEFT = "the client closed the connection"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_HEAD_MESSAGE = f"the request line and headers exceed {HEAD_LIMIT_BYTES} bytes".encode()
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    + f"content-length: {len(_HEAD_MESSAGE)}\r\n".encode()
    + b"connection: close\r\n\r\n"
    + _HEAD_MESSAGE
)


class Connection(HttpToolsProtocol):
    """uvicorn's httptools connection, with deadlines for requests and stalled replies.

    The worker sets the two timeouts on a subclass of its own
    (:meth:`configured`).
    """

    read_timeout_s: float = 30.0
    io_timeout_s: float = 60.0
    # This worker's connections within its descriptor limit (descriptors.py).
    descriptors: Descriptors | None = None
    _admitted = False

    @classmethod
    def configured(
        cls, read_timeout_s: float, io_timeout_s: float, descriptors: Descriptors
    ) -> type[Connection]:
        attributes = {
            "read_timeout_s": read_timeout_s,
            "io_timeout_s": io_timeout_s,
            "descriptors": descriptors,
        }
        return type("Connection", (cls,), attributes)

    def connection_made(self, transport: Any) -> None:
        if self.descriptors is not None and not self.descriptors.admit():
            transport.close()
            return
        self._admitted = True
        self._deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None
        self._body_watch: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_read = 0.0
        # A request has begun whose head (and body, if small) is not all in.
        self._arriving = False
        # Bytes fed while no request head was complete: a head being sent.
        self._head_open = True
        self._head_bytes = 0
        self._completed = False
        super().connection_made(transport)
        self._arm_deadline()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # uvicorn's, keeping the task: connection_lost cancels it.
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self._task = task

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        if self.descriptors is not None:
            self.descriptors.closed()
        task = self._task
        if task is not None and not task.done():
            self.loop.call_later(DISCONNECT_GRACE_S, task.cancel, CLIENT_LEFT)
        self._cancel_deadline()
        self._cancel_body_watch()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._body_watch is not None:
            self._last_read = self.loop.time()
        self._completed = False
        super().data_received(data)
        # Counted after the parser had them, and only where no request ended
        # in them: bytes that completed a head or a request are not a head
        # too large. So a head may run one read (256 KiB) past the limit.
        if self._head_open and not self._completed:
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_LIMIT_BYTES and not self.transport.is_closing():
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arriving = True
        # One pipelined behind a request still being answered gets its
        # deadline from that answer on (on_response_complete).
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_deadline()

    def on_headers_complete(self) -> None:
        self._head_open = False
        super().on_headers_complete()
        if not self._small_body():
            self._arriving = False
            self._cancel_deadline()
            self._last_read = self.loop.time()
            self._body_watch = self.loop.call_later(self.io_timeout_s, self._check_body)

    def _small_body(self) -> bool:
        for name, value in self.headers:
            if name == b"content-length":
                return value.isdigit() and int(value) <= BODY_DEADLINE_BYTES
            if name == b"transfer-encoding":
                return False
        return True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._arriving = False
        self._completed = self._head_open = True
        self._head_bytes = 0
        self._cancel_deadline()
        self._cancel_body_watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._arriving and self._deadline is None and not self.transport.is_closing():
            self._arm_deadline()

    def pause_writing(self) -> None:
        # The client stopped reading its reply: it gets io_timeout_s to go on.
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.io_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        super().resume_writing()

    def _write_timed_out(self) -> None:
        self._stalled = None
        self.logger.debug("closing a connection whose client stopped reading its reply")
        self.transport.abort()

    def _arm_deadline(self) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        self.logger.debug("closing a connection whose request did not arrive in time")
        self.transport.close()

    def _check_body(self) -> None:
        """Close the connection if its body has sent nothing for io_timeout_s."""
        now = self.loop.time()
        # Reading paused: the app has not taken the bytes it has, and the
        # client cannot be blamed for waiting.
        if self.flow.read_paused:
            self._last_read = now
        waited = now - self._last_read
        if waited < self.io_timeout_s:
            self._body_watch = self.loop.call_later(self.io_timeout_s - waited, self._check_body)
            return
        self._body_watch = None
        self.logger.debug("closing a connection whose request body stopped arriving")
        self.transport.close()

    def _cancel_body_watch(self) -> None:
        if self._body_watch is not None:
            self._body_watch.cancel()
            self._body_watch = None


class _Server(Server):
    """uvicorn's server, stopping at once on SIGTERM, and exiting normally after it."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        # uvicorn looks at should_exit every 0.1 s; the listener and idle
        # connections close now. call_soon_threadsafe: a signal handler may
        # run inside the loop's own code, which must not be re-entered.
        with contextlib.suppress(RuntimeError):  # no loop yet, or already closed
            asyncio.get_running_loop().call_soon_threadsafe(self._stop_accepting)

    def quit(self) -> None:
        """Stop without waiting for requests in flight (gunicorn's SIGQUIT)."""
        self.should_exit = self.force_exit = True
        self._stop_accepting()

    def _stop_accepting(self) -> None:
        for server in getattr(self, "servers", ()):
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn raises a captured SIGTERM again once it has stopped, which
        # (with gunicorn's workers' default disposition) kills the process
        # before gunicorn's worker_exit hook: the model client would never
        # close. The worker returns instead, as gunicorn's own workers do.
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class HttpWorker(UvicornWorker):  # type: ignore[misc]
    """uvicorn's gunicorn worker with request deadlines, a prompt stop and gunicorn's TLS."""

    def init_process(self) -> None:
        config = self.app.context.config
        http = config.http
        settings: dict[str, Any] = {
            "app": None,  # the app gunicorn loads, in _serve
            "loop": config.server.event_loop,
            "http": Connection.configured(
                http.read_timeout_s, http.io_timeout_s, Descriptors("http")
            ),
            "lifespan": "off",
            "log_config": None,
            # The app's observer writes the access lines; no client address
            # is taken from a header (gunicorn's ASGI worker trusted none).
            "access_log": False,
            "proxy_headers": False,
            "server_header": False,
            "timeout_keep_alive": self.cfg.keepalive,
            "timeout_notify": self.timeout,
            "callback_notify": self.callback_notify,
            "timeout_graceful_shutdown": self.cfg.graceful_timeout,
            "limit_max_requests": self.max_requests,
            "backlog": self.cfg.backlog,
        }
        self.config = Config(**settings)
        logging.getLogger("uvicorn.error").addFilter(_ClientLeft())
        die_with_parent()
        super().init_process()

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        self.config.load()
        if self.cfg.is_ssl:
            self.config.ssl = gunicorn_sock.ssl_context(self.cfg)
        server = _Server(config=self.config)
        asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, server.quit)
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)


class _ClientLeft(logging.Filter):
    """Drop uvicorn's traceback of a request cancelled because its client left.

    uvicorn logs any exception out of the app, this one too; a filter costs
    nothing per request, where wrapping the app would.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, asyncio.CancelledError) and error.args == (CLIENT_LEFT,))
