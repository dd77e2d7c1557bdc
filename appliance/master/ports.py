"""Reserve each frontend's TCP port before any child starts.

gRPC and MIP frontend processes of one kind share a port with SO_REUSEPORT.
Port 0 must therefore become one concrete port first, or each process would
get its own. The master binds (without listening) a SO_REUSEPORT socket on
every such port and keeps it for its lifetime: this finds the port for 0,
fails early with a clear error when another program holds the port, and
takes no connections itself, since only listening sockets join the kernel's
reuseport group.

The HTTP port is different: the master listens on it itself and hands the
socket to the gunicorn arbiter, whose workers inherit it (``listen``). The
kernel's queue of connections then outlives any HTTP process: while a
killed arbiter is replaced, new connections wait in the queue instead of
being refused, and a reuseport member's exit cannot reset connections
queued on it.
"""

from __future__ import annotations

import socket

from appliance.config import ApplianceConfig

# gunicorn's own default: connections the kernel queues while every HTTP
# worker is busy or being replaced.
HTTP_BACKLOG = 2048


class PortError(Exception):
    """A configured port cannot be used."""


class Ports:
    """Every frontend port of one tree, held by the master for its lifetime.

    ``by_name`` maps "http", "grpc" and "mip" (the first MIP listener) to the
    actual port; ``mip_listeners`` lists (port, model) for every MIP listener.

    Raises:
        PortError: a configured port is in use or cannot be bound.
    """

    def __init__(self, config: ApplianceConfig) -> None:
        host = config.server.host
        self._held: list[socket.socket] = []
        try:
            http = self._keep(listen(host, config.http.port, "http.port", HTTP_BACKLOG))
            self.http_listener: socket.socket | None = self._held[-1]
            grpc = self._keep(reserve(host, config.grpc.port, "grpc.port"))
            self.mip_listeners = [
                (
                    self._keep(reserve(host, listener.port, f"mip.listeners[{index}].port")),
                    config.mip_model(listener),
                )
                for index, listener in enumerate(config.mip.listeners)
            ]
        except PortError:
            self.close()
            raise
        self.by_name = {"http": http, "grpc": grpc, "mip": self.mip_listeners[0][0]}

    def _keep(self, bound: tuple[socket.socket, int]) -> int:
        """Hold the socket for the tree's lifetime; return its port."""
        self._held.append(bound[0])
        return bound[1]

    def close_http_listener(self) -> None:
        """Stop queueing HTTP connections once the HTTP frontend is stopping.

        Its processes close their copies as they stop; the master's copy
        would otherwise keep accepting connections nobody will serve.
        """
        listener = self.http_listener
        if listener is not None:
            self.http_listener = None
            self._held.remove(listener)
            listener.close()

    def close(self) -> None:
        for sock in self._held:
            sock.close()
        self._held.clear()
        self.http_listener = None


def reserve(host: str, port: int, key: str) -> tuple[socket.socket, int]:
    """Bind a placeholder on (host, port); return it and the actual port.

    Args:
        key: the config key, named in errors (e.g. ``http.port``).

    Raises:
        PortError: the address is in use or cannot be bound.
    """
    placeholder = _bound(host, port, key, reuse_port=True)
    return placeholder, placeholder.getsockname()[1]


def listen(host: str, port: int, key: str, backlog: int) -> tuple[socket.socket, int]:
    """Listen on (host, port) for children to inherit; return it and the actual port.

    Raises:
        PortError: the address is in use or cannot be bound.
    """
    listener = _bound(host, port, key, reuse_port=False)
    listener.listen(backlog)
    return listener, listener.getsockname()[1]


def _bound(host: str, port: int, key: str, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as ex:
        sock.close()
        raise PortError(f"cannot use {host}:{port} ({key}): {ex.strerror}") from None
    return sock
