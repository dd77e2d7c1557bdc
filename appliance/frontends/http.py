"""The HTTP frontend: a gunicorn arbiter whose workers serve one falcon app.

The master starts this process; gunicorn then forks its workers. Nothing
that must not cross a fork exists before that: each worker builds its model
client (ZeroMQ context, request ring) in ``load()``, after the fork. Workers
use the gthread class, so one worker holds several requests in flight and
keeps HTTP/1.1 connections alive (tritonclient reuses them).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import falcon
from gunicorn.app.base import BaseApplication

from appliance import logs
from appliance.client.api import ModelClient
from appliance.core.status import Role, SlotState
from appliance.frontends import auth
from appliance.frontends.context import FrontendContext
from appliance.frontends.metrics import MetricsResource
from appliance.frontends.observe import HttpObserver
from appliance.frontends.slots import claim_slot
from appliance.process import become_child
from appliance.protocols.dashboard import rest as dashboard_rest
from appliance.protocols.graphpipe import rest as graphpipe_rest
from appliance.protocols.grps import rest as grps_rest
from appliance.protocols.kserve import rest as kserve_rest
from appliance.protocols.umbridge import rest as umbridge_rest
from appliance.protocols.web import App

# Every protocol's REST routes, mounted into one app; each renders its own errors.
PROTOCOLS = (kserve_rest, grps_rest, umbridge_rest, graphpipe_rest, dashboard_rest)

log = logging.getLogger("appliance.http")


def create_app(client: ModelClient) -> App:
    """Assemble the falcon app every protocol's REST routes mount into."""
    app = falcon.App(middleware=[HttpObserver(), *auth.http_middleware(client.config)])
    for protocol in PROTOCOLS:
        protocol.add_routes(app, client)
    app.add_route("/metrics", MetricsResource(client))
    return app


class HttpApplication(BaseApplication):  # type: ignore[misc]
    """gunicorn, embedded; its settings come from the appliance config."""

    def __init__(
        self,
        context: FrontendContext,
        slot: int,
        port: int,
        listen_fd: int | None,
        worker_slots: str,
    ) -> None:
        self.context = context
        self.slot = slot
        self.port = port
        self.listen_fd = listen_fd
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
        settings: dict[str, Any] = {
            "bind": [bind],
            "workers": config.http.workers,
            "worker_class": "appliance.frontends.httpworker.LingeringThreadWorker",
            "threads": config.http.threads,
            "reuse_port": self.listen_fd is None,
            "timeout": int(config.http.timeout_s),
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

    def load(self) -> App:
        """Build this worker's client and app; runs in the worker, after fork."""
        logs.setup("http-worker", self.context.config.server.log_level)
        logs.set_access_log(self.context.config.server.access_log)
        first, count = self.worker_slots
        slot = claim_slot(
            self.context.status, first, count, self.context.tree.dir, Role.HTTP_WORKER
        )
        self.client = self.context.client(publish_slot=slot)
        return create_app(self.client)

    def _when_ready(self, _server: Any) -> None:
        self.context.status.set_state(self.slot, SlotState.READY, os.getpid())
        log.info("listening on %s:%d", self.context.config.server.host, self.port)

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
) -> int:
    """Run the gunicorn arbiter until it is told to stop."""
    context = FrontendContext.open(tree_dir)
    logs.setup("http", context.config.server.log_level)
    become_child("http", master_pid)
    HttpApplication(context, slot, port, listen_fd, worker_slots).run()
    return 0
