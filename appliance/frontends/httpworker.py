"""A gunicorn worker class: uvicorn's (uvloop), serving the appliance's HTTP/1.1 connection.

gunicorn stays the process manager (its arbiter holds the master's listening
socket, forks the workers and replaces dead ones); each worker is one uvloop
loop (``server.event_loop``) run by uvicorn's server, whose connections are
the appliance's own (http11.py, on the httptools (llhttp) parser, compiled
with the request path). Against gunicorn's own ASGI worker uvicorn's costs
about half the server CPU per new connection and up to a third less per
keep-alive request (bench/profiles/README.md, "The HTTP stack"). A request
waiting on a model holds no thread, and a slow client holds only its
connection. What the appliance's connection and this worker add:

- The connection's deadlines and limits (http11.py): a request's head and
  small body within ``http.read_timeout_s``, a larger body's reads and a
  stalled reply within ``http.io_timeout_s``, a head within 64 KiB.
- On SIGTERM the worker stops accepting at once (the master's socket keeps
  queueing connections for the other workers or the next arbiter), closes
  its idle keep-alive connections and finishes the requests in flight, then
  exits normally, so gunicorn's ``worker_exit`` hook runs.
- The kernel sends the worker SIGTERM when its arbiter dies (PR_SET_PDEATHSIG).
- TLS is gunicorn's own context (``gunicorn.sock.ssl_context``); no proxy
  headers are trusted, no Server header is sent, and no access line is
  written but the app's observer's (``frontends/observe_http.py``).

Configured as ``appliance.frontends.httpworker.HttpWorker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys
from collections.abc import Iterator
from typing import Any

from gunicorn import sock as gunicorn_sock
from gunicorn.arbiter import Arbiter
from uvicorn.config import Config
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from appliance.frontends.descriptors import Descriptors
from appliance.frontends.http11 import Connection, Limits
from appliance.processes.lifetime import die_with_parent

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
    """uvicorn's gunicorn worker: the appliance's connection, a prompt stop, gunicorn's TLS."""

    def init_process(self) -> None:
        config = self.app.context.config
        http = config.http
        settings: dict[str, Any] = {
            "app": None,  # the app gunicorn loads, in _serve
            "loop": config.server.event_loop,
            "http": functools.partial(
                Connection,
                limits=Limits(
                    http.read_timeout_s,
                    http.io_timeout_s,
                    float(self.cfg.keepalive),
                    Descriptors("http"),
                ),
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
