"""Listening sockets that the master owns and its frontend children inherit.

The master listens on every frontend port (HTTP, gRPC, each MIP listener)
before any child starts, and passes each socket to the processes that serve
it (``pass_fds``). The kernel's queue of connections then belongs to the
master's socket, not to a child: when a frontend process dies, even by
SIGKILL, the connections queued for the port wait for a sibling (or the
restarted process) instead of being reset, and while no process of a kind
is alive new connections wait instead of being refused. Processes that
each bind the port with SO_REUSEPORT would each hold a queue of their own,
and the kernel resets what is queued on one when its process dies.

A child never calls ``shutdown()`` on an inherited socket: on a listening
socket it stops the listening for every process that holds it.
"""

from __future__ import annotations

import os
import socket


class ListenerError(Exception):
    """An inherited descriptor is not a listening TCP socket."""


def inherited(fd: int) -> socket.socket:
    """Wrap an inherited listening socket, non-blocking and closed on exec.

    Raises:
        ListenerError: ``fd`` is not open, or not a listening TCP socket.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError as ex:
        raise ListenerError(f"descriptor {fd} is not an inherited socket: {ex}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    ):
        sock.detach()
        raise ListenerError(f"descriptor {fd} is not a listening TCP socket")
    # O_NONBLOCK is the socket's, shared with the master and the siblings;
    # none of them blocks in accept().
    sock.setblocking(False)
    os.set_inheritable(fd, False)
    return sock


def parse_fds(text: str) -> list[int]:
    """Parse the master's ``fd,fd,...`` argument."""
    return [int(item) for item in text.split(",") if item]
