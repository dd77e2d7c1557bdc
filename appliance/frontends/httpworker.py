"""A gunicorn worker class: gunicorn's ASGI worker, with the appliance's limits.

Each HTTP worker is one asyncio loop: a request waiting on a model holds no
thread, and a slow client holds only its connection. Four additions to
gunicorn's ASGI worker:

- A request's headers, and a body up to ``BODY_DEADLINE_BYTES`` declared by
  Content-Length, must arrive within ``http.read_timeout_s`` of the
  connection opening (or of the first byte of a keep-alive connection's next
  request, or, for a request pipelined behind another, of that one's
  answer); else the connection is closed. gunicorn bounds each wait for body
  bytes (``timeout``, set to ``http.io_timeout_s``), not a request that never
  completes.
- A client that stops reading its reply for ``http.io_timeout_s`` is cut
  off, so an unread reply does not stay in memory (also where a large
  reply goes out through ``writelines``, whose flow control Python lacks
  before 3.12.9 and 3.13.2).
- On SIGTERM the worker stops accepting at once (the master's socket keeps
  queueing connections for the other workers or the next arbiter), closes
  its idle keep-alive connections and finishes the requests in flight.
  gunicorn would look once a second, and wait for idle connections until
  the graceful timeout.
- The kernel sends the worker SIGTERM when its arbiter dies (PR_SET_PDEATHSIG).

Configured as ``appliance.frontends.httpworker.HttpWorker``.
"""

from __future__ import annotations

import asyncio
import sys
from asyncio import selector_events
from typing import Any

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers import gasgi
from gunicorn.workers.gasgi import ASGIWorker

from appliance.process import die_with_parent

# The plain socket transport's writelines() lacks flow control before CPython
# 3.12.9 and 3.13.2 (gh-127655; 3.11 has no writelines of its own).
_VERSION = sys.version_info[:3]
_WRITELINES_NEVER_PAUSES = (3, 12) <= _VERSION < (3, 12, 9) or (3, 13) <= _VERSION < (3, 13, 2)
_SOCKET_TRANSPORT: Any = getattr(selector_events, "_SelectorSocketTransport", type(None))

# Bodies up to this size must arrive within http.read_timeout_s; larger ones
# may take longer, each wait for more bytes bounded by http.io_timeout_s.
BODY_DEADLINE_BYTES = 1 << 20


# PATCH: gunicorn caches whether its C parser (gunicorn_h1c) can be used on
# the class it is asked from, but reads the answer from ASGIProtocol: asked
# from a subclass, it picks the pure-Python parser on every connection.
# Asking ASGIProtocol itself first fills in what gunicorn reads.
ASGIProtocol._check_h1c_protocol_available()


class _Connection(ASGIProtocol):  # type: ignore[misc]
    """gunicorn's connection, with a deadline for each request to arrive."""

    worker: HttpWorker

    def connection_made(self, transport: Any) -> None:
        self._deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self.worker.connections.add(self)
        self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.resume_writing()
        self.worker.connections.discard(self)
        super().connection_lost(exc)

    def _on_headers_complete(self) -> Any:
        result = super()._on_headers_complete()
        request = self._current_request
        small = not request.chunked and request.content_length <= BODY_DEADLINE_BYTES
        if not small:
            self._cancel_deadline()
        return result

    def _on_message_complete(self) -> None:
        self._cancel_deadline()
        super()._on_message_complete()

    def _feed_callback_parser(self, data: bytes) -> bool:
        # The first bytes of a keep-alive connection's next request: fresh
        # ones, or a pipelined tail that gunicorn feeds again once the
        # request before it is answered.
        if self._deadline is None and self._current_request is None:
            self._arm_deadline()
        fed: bool = super()._feed_callback_parser(data)
        return fed

    def _send_body(self, *args: Any, **kwargs: Any) -> None:
        super()._send_body(*args, **kwargs)
        transport: Any = self.transport
        if _WRITELINES_NEVER_PAUSES and isinstance(transport, _SOCKET_TRANSPORT):
            # PATCH: large bodies go out through transport.writelines(), which
            # on these Pythons never pauses the protocol (CPython gh-127655):
            # a client that stops reading would have its whole reply buffered
            # here and never be cut off. This is the check the fix added. (TLS
            # transports write through write(), whose flow control works.)
            transport._maybe_pause_protocol()

    def pause_writing(self) -> None:
        # The client stopped reading its reply: it gets io_timeout_s to go on.
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.worker.loop.call_later(
                self.worker.io_timeout_s, self._write_timed_out
            )

    def resume_writing(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        super().resume_writing()

    def _write_timed_out(self) -> None:
        self._stalled = None
        self.log.debug("closing a connection whose client stopped reading its reply")
        self.transport.abort()

    def _arm_deadline(self) -> None:
        self._cancel_deadline()
        self._deadline = self.worker.loop.call_later(
            self.worker.read_timeout_s, self._read_timed_out
        )

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        self.log.debug("closing a connection whose request did not arrive in time")
        self.close_now()

    @property
    def idle(self) -> bool:
        """Whether no request is being served (one may be arriving)."""
        return bool(self._awaiting_request) and not self._finishing_calls

    def close_now(self) -> None:
        self._close_transport()
        # Wakes the connection's loop, which sees the closed transport and ends.
        if self._request_ready is not None:
            self._request_ready.set()


class HttpWorker(ASGIWorker):  # type: ignore[misc]
    """gunicorn's ASGI worker with request deadlines and a prompt stop."""

    def init_process(self) -> None:
        self.connections: set[_Connection] = set()
        http = self.app.context.config.http
        self.read_timeout_s: float = http.read_timeout_s
        self.io_timeout_s: float = http.io_timeout_s
        # gunicorn builds each connection's protocol from this module-level
        # name and offers no hook; rebinding it is process-wide, and this
        # process serves only the appliance.
        gasgi.ASGIProtocol = _Connection
        die_with_parent()
        super().init_process()

    def handle_exit_signal(self) -> None:
        super().handle_exit_signal()
        for server in self.servers:
            server.close()
        for connection in list(self.connections):
            if connection.idle:
                connection.close_now()

    async def _shutdown(self) -> None:
        # Connections that went idle after SIGTERM close too (gunicorn closes
        # a connection once its answer is sent while the worker stops, but
        # not one that was waiting for a request).
        for connection in list(self.connections):
            if connection.idle:
                connection.close_now()
        await super()._shutdown()
