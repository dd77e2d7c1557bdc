"""A gunicorn worker class: gthread, but threads never wait on slow clients.

Two changes to gunicorn's gthread worker:

- Its poller thread reads each request (headers, and a body up to
  ``PREREAD_BYTES``) without blocking before a pool thread takes the
  connection. gthread hands a connection to a thread as soon as its first
  byte arrives, and the thread then blocks reading the rest: a few clients
  trickling bytes (slowloris) would hold every thread and starve the port.
  A request that does not arrive within ``http.read_timeout_s`` is dropped.
  A larger body is read by the thread, each read bounded by
  ``http.io_timeout_s``, and so is writing the response.
- The thread that served a request waits briefly (``LINGER_S``) for the same
  connection's next one and serves it directly: gthread's hand-off to the
  poller and back costs two thread switches per request, more than the
  request itself on this machine. A connection that stays quiet goes back to
  the poller as usual, and no thread lingers while every thread is busy.

When the worker must stop (SIGTERM, or its arbiter died), it closes its
copy of the listening socket at once and stops accepting; the master's
socket (see ``master/ports.py``) keeps queueing connections for the other
workers or the next arbiter. Without a master's socket the port is shared
with SO_REUSEPORT, and a listener that stayed open without accepting would
keep receiving connections and leave them hanging. The kernel sends this
worker SIGTERM when its arbiter dies (PR_SET_PDEATHSIG).

Configured as ``appliance.frontends.httpworker.LingeringThreadWorker``.
"""

from __future__ import annotations

import contextlib
import io
import re
import select
import selectors
import threading
import time
from functools import partial
from typing import Any

from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import ThreadWorker

from appliance.process import die_with_parent

LINGER_S = 0.005
# Bodies up to this size arrive whole before a thread is committed; larger
# ones stream into the thread, which keeps its memory use what it was.
# PERF: needs gunicorn >= 27, whose body reader takes a read-ahead buffer in
# large steps; 26 took 1 KiB at a time, copying the whole buffer each time
# (a 1 MiB body read ahead took 40 ms to reach the app).
PREREAD_BYTES = 1 << 20
# Past this many bytes without the end of the headers, gunicorn's parser
# answers (it refuses oversized headers with its own error).
HEADER_BYTES = 128 * 1024
RECV_BYTES = 256 * 1024

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_CONTINUE = re.compile(rb"\r\nexpect:[ \t]*100-continue", re.IGNORECASE)


def request_complete(
    data: bytes, body_limit: int, size: int | None = None, tail: bytes | None = None
) -> bool:
    """Whether ``data`` holds enough of a request to give it a thread.

    ``data`` is the request read so far, or its first ``HEADER_BYTES + 4``
    bytes with ``size`` its whole length and ``tail`` its last five bytes:
    the caller need not copy a large body to ask.

    True once the headers and a small body have arrived, or the headers of
    a large body, or when waiting longer could not help (oversized headers,
    a client expecting ``100 Continue`` before it sends the body, a declared
    length over ``body_limit`` that the app refuses unread). A chunked
    body counts as whole once it ends with the last-chunk marker; one with
    trailers waits for the deadline and then goes to a thread as it is.
    """
    size = len(data) if size is None else size
    tail = data[-5:] if tail is None else tail
    end = data.find(b"\r\n\r\n", 0, HEADER_BYTES + 4)
    if end < 0:
        return size > HEADER_BYTES
    head = data[:end]
    body = size - end - 4
    if _CONTINUE.search(head):
        return True
    if _CHUNKED.search(head):
        return body > PREREAD_BYTES or tail.endswith(b"0\r\n\r\n")
    length = _CONTENT_LENGTH.search(head)
    if length is None:
        return True
    declared = int(length.group(1))
    return declared > body_limit or body >= min(declared, PREREAD_BYTES)


class LingeringThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gthread with non-blocking request reading and a short linger."""

    def init_process(self) -> None:
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._listening = True
        # Connections whose request is still arriving, with their deadlines.
        self._gathering: dict[Any, float] = {}
        # The app refuses larger bodies from Content-Length, before reading.
        http = self.app.context.config.http
        self._body_limit: int = http.max_body_bytes
        self._read_timeout_s: float = http.read_timeout_s
        self._io_timeout_s: float = http.io_timeout_s
        die_with_parent()
        super().init_process()

    # -- stopping ------------------------------------------------------------

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        # Signal context: let the worker's own loop close the listeners.
        self.method_queue.defer(self._close_listeners)

    def is_parent_alive(self) -> bool:
        alive = bool(super().is_parent_alive())
        if not alive:
            self._close_listeners()
        return alive

    def _close_listeners(self) -> None:
        if not self._listening:
            return
        self._listening = False
        self.set_accept_enabled(False)
        for listener in self.sockets:
            listener.close()

    # -- reading requests in the poller thread ---------------------------------

    def _prereads(self, conn: Any) -> bool:
        # TLS and HTTP/2 frame their bytes themselves; those connections
        # keep gthread's own reading.
        if self.cfg.is_ssl or conn.is_http2:
            return False
        return not negotiation.prior_knowledge_allowed(self.cfg, conn.client)

    def enqueue_req(self, conn: Any) -> None:
        if not self._prereads(conn):
            super().enqueue_req(conn)
            return
        # init() only builds the parser here (no TLS, no preface to sniff);
        # the socket stays non-blocking while the poller reads from it.
        conn.init()
        conn.sock.setblocking(False)
        self._gathering.setdefault(conn, time.monotonic() + self._read_timeout_s)
        self._gather(conn, registered=False)

    def _gather(self, conn: Any, registered: bool) -> None:
        state = _read_available(conn, self._body_limit)
        if state is None:
            if not registered:
                callback = partial(self._on_readable, conn)
                self.poller.register(conn.sock, selectors.EVENT_READ, callback)
            return
        if registered:
            self.poller.unregister(conn.sock)
        del self._gathering[conn]
        if state is False and not conn.parser.unreader.buf.getbuffer().nbytes:
            self._drop(conn)  # closed before sending anything
        else:
            self._dispatch(conn)

    def _on_readable(self, conn: Any, _sock: Any) -> None:
        self._gather(conn, registered=True)

    def _dispatch(self, conn: Any) -> None:
        conn.sock.setblocking(True)
        conn.data_ready = True
        super().enqueue_req(conn)

    def _drop(self, conn: Any) -> None:
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        for conn, deadline in list(self._gathering.items()):
            if deadline > now:
                continue
            del self._gathering[conn]
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)
            # Headers that did arrive get a thread and the parser's answer
            # (and a read timeout); a request still without them is dropped.
            if b"\r\n\r\n" in conn.parser.unreader.buf.getvalue():
                self._dispatch(conn)
            else:
                self._drop(conn)

    # -- serving -------------------------------------------------------------

    def handle_request(self, req: Any, conn: Any) -> Any:
        # A large body's remainder and the response travel with a timeout,
        # so a client that stops reading or writing frees its thread.
        conn.sock.settimeout(self._io_timeout_s)
        return super().handle_request(req, conn)

    def handle(self, conn: Any) -> Any:
        with self._busy_lock:
            self._busy += 1
        try:
            result = super().handle(conn)
            while result is True and self.alive and self._next_request_soon(conn):
                result = super().handle(conn)
            return result
        finally:
            with self._busy_lock:
                self._busy -= 1

    def _next_request_soon(self, conn: Any) -> bool:
        """Whether the connection's next request arrived whole within LINGER_S."""
        if self._busy >= self.cfg.threads:
            return False
        if not self._prereads(conn):
            return self._readable_soon(conn)
        deadline = time.monotonic() + LINGER_S
        conn.sock.setblocking(False)
        try:
            while True:
                state = _read_available(conn, self._body_limit)
                if state is not None:
                    break
                # Part of the request is in the buffer: wait on the socket
                # itself, not on the buffer (which would spin till the deadline).
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not _readable_within(conn.sock, remaining):
                    # Whatever arrived stays in the parser's buffer; the
                    # poller reads the rest once the thread lets go.
                    return False
        finally:
            conn.sock.setblocking(True)
        # A closed connection goes to the parser, which ends it cleanly.
        return state or bool(conn.parser.unreader.buf.getbuffer().nbytes)

    def _readable_soon(self, conn: Any, wait_s: float = LINGER_S) -> bool:
        # PERF: one select() call; gunicorn's wait_for_data builds an epoll
        # selector (four system calls) every time.
        if conn.parser is not None and conn.parser.unreader.buf.getbuffer().nbytes:
            return True  # a pipelined request already waits in the buffer
        return _readable_within(conn.sock, wait_s)


def _readable_within(sock: Any, wait_s: float) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], wait_s)
    except (OSError, ValueError):
        return False
    return bool(readable)


def _read_available(conn: Any, body_limit: int) -> bool | None:
    """Read what the non-blocking socket has into the parser's buffer.

    Returns True when the buffer holds a request to serve, False when the
    client closed the connection (or it failed), None while more is due.
    """
    buffer = conn.parser.unreader.buf
    buffer.seek(0, 2)
    while True:
        if _buffer_complete(buffer, body_limit):
            return True
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return False
        if not data:
            return False
        buffer.write(data)


def _buffer_complete(buffer: io.BytesIO, body_limit: int) -> bool:
    # PERF: a body arrives in many reads; copying the whole buffer to look at
    # it after each one would make gathering a large body quadratic.
    with buffer.getbuffer() as view:
        size = view.nbytes
        prefix = bytes(view[: HEADER_BYTES + 4])
        tail = bytes(view[-5:])
    return request_complete(prefix, body_limit, size, tail)
