"""A gunicorn worker class: gthread, but a thread keeps a busy connection.

gunicorn's gthread worker hands a keep-alive connection back to its poller
thread after every request, and the poller hands it to a pool thread again
when the next request arrives: two thread hand-offs per request, which on
this machine kind cost more than the request itself. This worker lets the
thread that served a request wait briefly (``LINGER_S``) for the same
connection's next one and serve it directly. A connection that stays quiet
goes back to the poller as usual, and no thread lingers while every thread
is busy, so idle clients never hold threads other clients need.

Configured as ``appliance.frontends.httpworker.LingeringThreadWorker``.
"""

from __future__ import annotations

import select
import threading
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

LINGER_S = 0.005


class LingeringThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gthread with a short linger for a connection's next request."""

    def init_process(self) -> None:
        self._busy = 0
        self._busy_lock = threading.Lock()
        super().init_process()

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
        if self._busy >= self.cfg.threads:
            return False
        # A pipelined request may already sit in the parser's buffer, where
        # the socket shows nothing: serve it now.
        unreader = conn.parser.unreader
        if unreader.buf.getbuffer().nbytes:
            return True
        # PERF: one select() call; gunicorn's wait_for_data builds an epoll
        # selector (four system calls) every time.
        try:
            readable, _, _ = select.select([conn.sock], [], [], LINGER_S)
        except (OSError, ValueError):
            return False
        ready = bool(readable)
        conn.data_ready = ready
        return ready
