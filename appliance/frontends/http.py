"""The HTTP frontend: a gunicorn arbiter whose workers serve one falcon app.

The master starts this process; gunicorn then forks its workers. Nothing
that must not cross a fork exists before that: each worker builds its model
client (ZeroMQ context, request ring) in ``load()``, after the fork. Each
worker is a uvloop loop (uvicorn's worker class with the httptools parser,
see ``httpworker.py``) serving a falcon ASGI app: inference waits in the
loop through the model client's asyncio channel, so requests in flight are
not capped by threads; blocking routes run on ``http.threads`` threads
(``protocols/web.py``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import falcon.asgi
from gunicorn.app.base import BaseApplication

from appliance.client.api import ModelClient
from appliance.core.status import Role, SlotState
from appliance.frontends import auth
from appliance.frontends.context import FrontendContext
from appliance.frontends.metrics import MetricsResource
from appliance.frontends.observe_http import HttpObserver
from appliance.frontends.slots import claim_slot
from appliance.observability import logs
from appliance.processes.lifetime import become_child
from appliance.protocols.bodies import ReadAhead
from appliance.protocols.dashboard import rest as dashboard_rest
from appliance.protocols.graphpipe import rest as graphpipe_rest
from appliance.protocols.grps import rest as grps_rest
from appliance.protocols.kserve import rest as kserve_rest
from appliance.protocols.openai import rest as openai_rest
from appliance.protocols.threads import Threads
from appliance.protocols.torchserve import management_rest as torchserve_management
from appliance.protocols.torchserve import rest as torchserve_rest
from appliance.protocols.umbridge import rest as umbridge_rest
from appliance.protocols.web import App

# Every protocol's REST routes, mounted into one app; each renders its own errors.
# GET / serves GraphPipe's default model, and the dashboard to a browser.
ROUTES: tuple[Callable[[App, ModelClient], None], ...] = (
    kserve_rest.add_routes,
    openai_rest.add_routes,
    grps_rest.add_routes,
    umbridge_rest.add_routes,
    torchserve_rest.add_routes,
    torchserve_management.add_routes,
    functools.partial(graphpipe_rest.add_routes, home_page=dashboard_rest.render),
    dashboard_rest.add_routes,
)

log = logging.getLogger("appliance.http")


def create_app(client: ModelClient, threads: Threads) -> App:
    """Assemble the falcon app every protocol's REST routes mount into."""
    # Refused requests are answered before their bodies are read.
    body = ReadAhead(client.config.http.max_body_bytes, threads)
    observer = HttpObserver(client.config.openai.prefix)
    app = falcon.asgi.App(middleware=[observer, *auth.http_middleware(client.config), body])
    for add_routes in ROUTES:
        add_routes(app, client)
    app.add_route("/metrics", MetricsResource(client))
    return app


Asgi = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def alone_on(port: int, app: Asgi, serves: Callable[[str], bool], what: str) -> Asgi:
    """Let ``port`` answer the paths ``serves`` accepts alone (404 for any other
    path), as Triton's metrics port and TorchServe's management port do; the
    HTTP port goes on serving everything."""
    body = f"this port serves {what} alone\n".encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]

    async def asgi(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        server = scope.get("server") or ("", 0)
        if scope["type"] != "http" or server[1] != port or serves(scope["path"]):
            await app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return asgi


def refusing_early(app: Asgi, limit: int) -> Asgi:
    """Let ``app`` answer a request whose declared body is over ``limit`` unread.

    falcon waits for the first chunk of a body before it runs anything: a
    client that sends its headers and waits (or is told to stop) would get
    no answer. Such a request gets an empty first chunk at once, and the
    route refuses it with 413 in its protocol's form (``web.read_body``).
    """

    async def asgi(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http" or _declared_length(scope) <= limit:
            await app(scope, receive, send)
            return
        started = False

        async def first_empty() -> Any:
            nonlocal started
            if started:
                return await receive()
            started = True
            return {"type": "http.request", "body": b"", "more_body": True}

        await app(scope, first_empty, send)

    return asgi


def _declared_length(scope: dict[str, Any]) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


class HttpApplication(BaseApplication):  # type: ignore[misc]
    """gunicorn, embedded; its settings come from the appliance config."""

    def __init__(
        self,
        context: FrontendContext,
        slot: int,
        port: int,
        listen_fd: int | None,
        worker_slots: str,
        metrics: tuple[int, int] | None = None,
        management: tuple[int, int] | None = None,
    ) -> None:
        self.context = context
        self.slot = slot
        self.port = port
        self.listen_fd = listen_fd
        # (port, inherited socket) of the port that answers /metrics alone.
        self.metrics = metrics
        # (port, inherited socket) of the port that answers the management API alone.
        self.management = management
        first, count = (int(part) for part in worker_slots.split(":"))
        self.worker_slots = (first, count)
        self.client: ModelClient | None = None
        super().__init__()

    def load_config(self) -> None:
        config = self.context.config
        # The master's listening socket when it passes one (the normal case:
        # its queue of connections outlives this process); else our own.
        if self.listen_fd is not None:
            bind = f"fd://{self.listen_fd}"
        else:
            bind = f"{config.server.host}:{self.port}"
        binds = [bind]
        for extra in (self.metrics, self.management):
            if extra is not None:
                binds.append(f"fd://{extra[1]}")
        settings: dict[str, Any] = {
            "bind": binds,
            "workers": config.http.workers,
            "worker_class": "appliance.frontends.httpworker.HttpWorker",
            "reuse_port": self.listen_fd is None,
            # A worker whose loop has not beaten for this long is stuck: the
            # arbiter replaces it (uvicorn's loop beats every timeout / 2).
            "timeout": max(1, int(config.http.io_timeout_s)),
            "graceful_timeout": int(config.server.stop_timeout_s),
            "keepalive": config.http.keepalive_s,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": config.server.log_level,
            "proc_name": "appliance: http",
            "control_socket_disable": True,
            "when_ready": self._when_ready,
            "worker_exit": self._worker_exit,
        }
        if config.tls.enabled:
            settings.update(certfile=config.tls.cert, keyfile=config.tls.key)
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Asgi:
        """Build this worker's client and app; runs in the worker, after fork."""
        logs.setup("http-worker", self.context.config.server.log_level)
        logs.set_access_log(self.context.config.server.access_log)
        first, count = self.worker_slots
        slot = claim_slot(
            self.context.status, first, count, self.context.tree.dir, Role.HTTP_WORKER
        )
        self.client = self.context.client(publish_slot=slot)
        http = self.context.config.http
        app = refusing_early(
            create_app(self.client, Threads(http.threads, "http")), http.max_body_bytes
        )
        if self.metrics is not None:
            app = alone_on(self.metrics[0], app, lambda path: path == "/metrics", "/metrics")
        if self.management is not None:
            app = alone_on(self.management[0], app, torchserve_management.is_management, "/models")
        return app

    def _when_ready(self, _server: Any) -> None:
        self.context.status.set_state(self.slot, SlotState.READY, os.getpid())
        host = self.context.config.server.host
        log.info("listening on %s:%d", host, self.port)
        if self.metrics is not None:
            log.info("listening on %s:%d for /metrics", host, self.metrics[0])
        if self.management is not None:
            log.info("listening on %s:%d for the management API", host, self.management[0])

    def _worker_exit(self, _server: Any, _worker: Any) -> None:
        # A worker whose arbiter died may exit with requests still running;
        # closing the client under them would fail them. The master removes
        # a dead process's segments anyway.
        if self.client is not None and not self.client.in_flight:
            self.client.close()


def run(
    tree_dir: Path,
    master_pid: int,
    slot: int,
    port: int,
    listen_fd: int | None,
    worker_slots: str,
    metrics: tuple[int, int] | None = None,
    management: tuple[int, int] | None = None,
) -> int:
    """Run the gunicorn arbiter until it is told to stop."""
    context = FrontendContext.open(tree_dir)
    logs.setup("http", context.config.server.log_level)
    become_child("http", master_pid)
    HttpApplication(context, slot, port, listen_fd, worker_slots, metrics, management).run()
    return 0
