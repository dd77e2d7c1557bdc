"""Reserve each frontend's TCP port before any child starts.

Frontend processes of one kind share a port with SO_REUSEPORT. Port 0 must
therefore become one concrete port first, or each process would get its
own. The master binds (without listening) a SO_REUSEPORT socket on every
configured port and keeps it for its lifetime: this finds the port for 0,
fails early with a clear error when another program holds the port, and
takes no connections itself, since only listening sockets join the kernel's
reuseport group.
"""

from __future__ import annotations

import socket


class PortError(Exception):
    """A configured port cannot be used."""


def reserve(host: str, port: int, key: str) -> tuple[socket.socket, int]:
    """Bind a placeholder on (host, port); return it and the actual port.

    Args:
        key: the config key, named in errors (e.g. ``http.port``).

    Raises:
        PortError: the address is in use or cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    placeholder = socket.socket(family, socket.SOCK_STREAM)
    placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    placeholder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        placeholder.bind((host, port))
    except OSError as ex:
        placeholder.close()
        raise PortError(f"cannot use {host}:{port} ({key}): {ex.strerror}") from None
    return placeholder, placeholder.getsockname()[1]
