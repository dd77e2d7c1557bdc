"""The gRPC frontend: one grpc.aio server per process, sharing the port.

Every one of these processes accepts from the master's listening socket
(``grpc_listener``), so one that dies takes no queued connection with it.
The server is created after the process started (gRPC does not survive
fork). Every protocol's servicer is registered here; each talks to models
through this process's model client.

PERF: an event loop rather than grpcio's thread-pool server. Inference
waits for its reply in the loop (the model client's asyncio channel), so a
call costs no hand-off between a poller thread and a pool thread, and the
number of calls in flight is not capped by a thread count, which lets
dynamic batching see them all. Calls that may block run on ``grpc.threads``
threads (frontends/threads.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
from pathlib import Path

import grpc

from appliance.config.listeners import ListenerError, inherited
from appliance.config.settings import ApplianceConfig
from appliance.core.status import SlotState
from appliance.frontends import auth, loops
from appliance.frontends.context import FrontendContext
from appliance.frontends.descriptors import Descriptors
from appliance.frontends.grpc_listener import serve_on
from appliance.frontends.grpc_registry import Registry, chain
from appliance.frontends.observe import observe_grpc
from appliance.observability import logs
from appliance.processes.exitcodes import ExitCode
from appliance.processes.helper_threads import started_batch
from appliance.processes.lifetime import become_child
from appliance.protocols import health_grpc
from appliance.protocols.grps import grpc as grps_grpc
from appliance.protocols.kserve import grpc as kserve_grpc
from appliance.protocols.threads import Threads
from appliance.protocols.torchserve import grpc as torchserve_grpc

# Every protocol's gRPC services, registered on one server.
PROTOCOLS = (health_grpc, kserve_grpc, grps_grpc, torchserve_grpc)

log = logging.getLogger("appliance.grpc")


def run(
    tree_dir: Path,
    master_pid: int,
    slot: int,
    listen_fd: int,
    index: int,
    management_fd: int | None = None,
) -> int:
    """Serve gRPC on the master's socket until SIGTERM, then finish what is in flight."""
    context = FrontendContext.open(tree_dir)
    config = context.config
    title = f"grpc[{index}]"
    logs.setup(title, config.server.log_level)
    logs.set_access_log(config.server.access_log)
    become_child(title, master_pid)
    fds = [listen_fd] if management_fd is None else [listen_fd, management_fd]
    return loops.run(_serve(context, slot, fds), config.server.event_loop)


def _connection_cap(config: ApplianceConfig) -> int:
    """The most connections this process holds: what its descriptor limit leaves
    once its event loop's ZeroMQ sockets (two descriptors per model instance) are open."""
    instances = sum(model.instances for model in config.models)
    cap = Descriptors("grpc").static_cap(2 * instances)
    if cap < 1024:
        log.warning("at most %d gRPC connections in this process (RLIMIT_NOFILE)", cap)
    return cap


async def _serve(context: FrontendContext, slot: int, listen_fds: list[int]) -> int:
    config = context.config
    # Created in the loop: the client's asyncio channel belongs to it.
    client = context.client(publish_slot=slot)
    threads = Threads(config.grpc.threads, "grpc")
    limit = config.grpc.max_message_bytes
    # grpcio starts its threads (event engine, poller) with its first server:
    # helpers, under SCHED_BATCH where asked (processes/helper_threads.py).
    with started_batch(config.server.helper_threads_batch):
        server = grpc.aio.server(
            options=[
                # Its own placeholder port is private to this process.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                # grpcio closes connections beyond it at once (uncounted), where at
                # the descriptor limit they would wait in the queue (descriptors.py).
                ("grpc.max_allowed_incoming_connections", _connection_cap(config)),
            ],
        )
    try:
        # The observer outermost: it counts and logs the calls auth refuses too.
        registry = Registry(server, chain(*auth.grpc_wraps(config), observe_grpc))
        for protocol in PROTOCOLS:
            protocol.add_to_server(registry, client, threads)
        listeners = []
        addresses = []
        try:
            for listen_fd in listen_fds:
                shared = inherited(listen_fd)
                addresses.append(f"{config.server.host}:{shared.getsockname()[1]}")
                if config.tls.enabled:
                    credentials = _credentials(config)
                    add = functools.partial(_add_secure, server, credentials)
                    listeners.append(serve_on(shared, add))
                else:
                    listeners.append(serve_on(shared, server.add_insecure_port))
        except ListenerError as ex:
            log.error("cannot serve the master's gRPC socket: %s", ex)
            for listener in listeners:
                listener.release()
            return ExitCode.BOOT_ERROR
        try:
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await server.start()
            context.status.set_state(slot, SlotState.READY, os.getpid())
            log.info("listening on %s", ", ".join(addresses))
            await stop.wait()
            context.status.set_state(slot, SlotState.STOPPING)
        finally:
            # Before any stop of the server, even one on the way out after an
            # error: its siblings keep accepting from the socket.
            for listener in listeners:
                listener.release()
        await server.stop(grace=config.server.stop_timeout_s)
        return ExitCode.OK
    finally:
        threads.shutdown()
        client.close()


def _add_secure(server: grpc.aio.Server, credentials: grpc.ServerCredentials, at: str) -> int:
    return server.add_secure_port(at, credentials)


def _credentials(config: ApplianceConfig) -> grpc.ServerCredentials:
    """TLS from [tls]: the PEM key and certificate chain, read at start."""
    key = Path(config.tls.key).read_bytes()
    chain = Path(config.tls.cert).read_bytes()
    return grpc.ssl_server_credentials([(key, chain)])
