"""Listen on each frontend's TCP port before any child starts.

The master listens on every frontend port itself (HTTP, gRPC, each MIP
listener) and holds the sockets for the tree's lifetime; the frontend
processes inherit them (``appliance.config.listeners``). This resolves port 0 to
one concrete port, fails early with a clear error when another program
holds a port, and puts the kernel's queue of connections in the master:
while a frontend process is killed and replaced, new connections wait in
the queue instead of being reset or refused.
"""

from __future__ import annotations

import socket

from appliance.config.settings import ApplianceConfig

# gunicorn's own default (it listens again on the socket it is handed, with
# its backlog): the connections the kernel queues while every process of a
# port is busy or being replaced.
BACKLOG = 2048


class PortError(Exception):
    """A configured port cannot be used."""


class Ports:
    """Every frontend port of one tree, held by the master for its lifetime.

    ``by_name`` maps "http", "grpc" and "mip" (the first MIP listener) to the
    actual port; ``mip_listeners`` lists (port, model) for every MIP listener,
    and ``mip_fds`` their sockets' descriptors in the same order.

    Raises:
        PortError: a configured port is in use or cannot be bound.
    """

    def __init__(self, config: ApplianceConfig) -> None:
        host = config.server.host
        self._held: list[socket.socket] = []
        self.mip_listeners: list[tuple[int, str]] = []
        self.mip_fds: list[int] = []
        self.metrics_fd: int | None = None
        self.management_fd: int | None = None
        self.grpc_management_fd: int | None = None
        metrics = management = grpc_management = None
        try:
            self.http_fd, http = self._keep(listen(host, config.http.port, "http.port"))
            if config.http.metrics_port is not None:
                where = listen(host, config.http.metrics_port, "http.metrics_port")
                self.metrics_fd, metrics = self._keep(where)
            if config.http.management_port is not None:
                where = listen(host, config.http.management_port, "http.management_port")
                self.management_fd, management = self._keep(where)
            self.grpc_fd, grpc = self._keep(listen(host, config.grpc.port, "grpc.port"))
            if config.grpc.management_port is not None:
                where = listen(host, config.grpc.management_port, "grpc.management_port")
                self.grpc_management_fd, grpc_management = self._keep(where)
            for index, listener in enumerate(config.mip.listeners):
                key = f"mip.listeners[{index}].port"
                fd, port = self._keep(listen(host, listener.port, key))
                self.mip_listeners.append((port, config.mip_model(listener)))
                self.mip_fds.append(fd)
        except PortError:
            self.close()
            raise
        self.by_name = {"http": http, "grpc": grpc}
        if metrics is not None:
            self.by_name["metrics"] = metrics
        if management is not None:
            self.by_name["management"] = management
        if grpc_management is not None:
            self.by_name["grpc_management"] = grpc_management
        if self.mip_listeners:  # none: no MIP
            self.by_name["mip"] = self.mip_listeners[0][0]

    def _keep(self, listener: tuple[socket.socket, int]) -> tuple[int, int]:
        """Hold the socket for the tree's lifetime; return its descriptor and port."""
        self._held.append(listener[0])
        return listener[0].fileno(), listener[1]

    def close(self) -> None:
        """Stop queueing connections: the frontends are stopping, or the tree failed to start.

        The frontend processes close their copies as they stop; the master's
        would otherwise keep accepting connections nobody will serve.
        """
        for sock in self._held:
            sock.close()
        self._held.clear()


def listen(host: str, port: int, key: str) -> tuple[socket.socket, int]:
    """Listen on (host, port) for children to inherit; return it and the actual port.

    Args:
        key: the config key, named in errors (e.g. ``http.port``).

    Raises:
        PortError: the address is in use or cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as ex:
        sock.close()
        raise PortError(f"cannot use {host}:{port} ({key}): {ex.strerror}") from None
    sock.listen(BACKLOG)
    return sock, sock.getsockname()[1]
