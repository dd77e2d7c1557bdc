"""Serve gRPC on the master's listening socket, which grpcio cannot be handed.

grpcio has no call that serves an inherited socket (grpc/grpc#19133), and
each process binding the port itself with SO_REUSEPORT gets a queue of its
own that the kernel resets when the process dies (see ``listeners``). So the
server is given a placeholder address, a loopback port of its own, and the
socket grpcio made for it is replaced under the same descriptor number by
the master's socket before the server starts:

1. ``add_insecure_port`` (or ``add_secure_port``) on ``127.0.0.1:0``: grpcio
   creates, binds and listens on a socket, and registers it with its epoll
   poller (edge-triggered, the event's data a pointer to its handle).
2. ``dup2`` puts the master's socket on that number. The placeholder is
   released, and the kernel drops its epoll registration with it.
3. The registration is made again for the master's socket, with the events
   and data grpcio gave the placeholder (read from ``/proc/self/fdinfo``),
   so grpcio's poller wakes its acceptor for the master's socket.

Nothing of grpcio changes: it accepts from the descriptor it made. Each step
is checked, and one that does not hold (a grpcio whose poller works
otherwise) is a ListenerError that stops the process from booting, never a
port served some other way.

On stop, grpcio calls ``shutdown()`` on its listening descriptor, which would
stop the master's socket listening for every process. :meth:`release` first
takes the socket away from grpcio: the epoll registration is removed and a
listening socket of no port (an abstract unix one) takes the number, so
grpcio shuts that down, and an accept it still tries finds nothing there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass

from appliance.config.listeners import ListenerError

_EPOLL_CTL_ADD = 1


class _EpollEvent(ctypes.Structure):
    # struct epoll_event is packed on x86-64 only (the kernel's ABI there).
    _pack_ = 1 if os.uname().machine == "x86_64" else 8
    _fields_ = [("events", ctypes.c_uint32), ("data", ctypes.c_uint64)]


@dataclass(frozen=True, slots=True)
class Registration:
    """One epoll instance's watch of a descriptor, as fdinfo shows it."""

    epoll_fd: int
    events: int
    data: int


def serve_on(shared: socket.socket, bind: Callable[[str], int]) -> GrpcListener:
    """Make a gRPC server that is not yet started accept on ``shared``.

    Args:
        shared: the master's listening socket, inherited.
        bind: the server's ``add_insecure_port`` or ``add_secure_port``,
            credentials bound; returns the port it listens on.

    Raises:
        ListenerError: grpcio did not make one epoll-registered listening
            socket for the placeholder, or the swap did not hold.
    """
    placeholder = "[::1]:0" if shared.family == socket.AF_INET6 else "127.0.0.1:0"
    port = bind(placeholder)
    if not port:
        raise ListenerError(f"gRPC could not listen on its placeholder {placeholder}")
    found = [fd for fd in _listening_fds(port) if fd != shared.fileno()]
    if len(found) != 1:
        raise ListenerError(f"gRPC made {len(found)} listening sockets on port {port}, not one")
    [fd] = found
    watches = registrations(fd)
    if len(watches) != 1:
        raise ListenerError(f"gRPC's listening socket is in {len(watches)} epoll sets, not one")
    [watch] = watches
    # grpcio accepts until EAGAIN, as from its own non-blocking socket.
    shared.setblocking(False)
    os.dup2(shared.fileno(), fd, inheritable=False)
    shared.close()
    listener = GrpcListener(fd, watch.epoll_fd)
    try:
        _epoll_add(watch, fd)
        if registrations(fd) != [watch]:
            raise ListenerError("the master's socket could not take the place of gRPC's own")
    except BaseException:
        listener.release()  # grpcio, torn down, must not shut the master's socket
        raise
    return listener


class GrpcListener:
    """The master's socket under grpcio's descriptor number."""

    def __init__(self, fd: int, epoll_fd: int) -> None:
        self.fd = fd
        self._epoll_fd = epoll_fd
        self._released = False

    def release(self) -> None:
        """Take the master's socket from grpcio before it stops (see the module)."""
        if self._released:
            return
        self._released = True
        epoll = select.epoll.fromfd(os.dup(self._epoll_fd))
        try:
            with contextlib.suppress(FileNotFoundError):  # not watched: nothing to undo
                epoll.unregister(self.fd)
        finally:
            epoll.close()
        # A number left closed could be reused by the next open() before
        # grpcio closes "its" descriptor; this socket holds it till then.
        stand_in = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stand_in.bind("")  # an abstract address of the kernel's choosing
        stand_in.listen(1)
        stand_in.setblocking(False)
        os.dup2(stand_in.fileno(), self.fd, inheritable=False)
        stand_in.close()


def registrations(fd: int) -> list[Registration]:
    """Every epoll set of this process that watches ``fd``, from fdinfo."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") != "anon_inode:[eventpoll]":
                continue
            with open(f"/proc/self/fdinfo/{name}") as info:
                lines = info.readlines()
        except OSError:
            continue  # closed meanwhile (the listdir's own descriptor, for one)
        for line in lines:
            # "tfd:  13 events: 8000001d data: 55fbe9e30820  pos:0 ino:... sdev:..."
            fields = line.split()
            if fields[:1] == ["tfd:"] and int(fields[1]) == fd:
                found.append(Registration(int(name), int(fields[3], 16), int(fields[5], 16)))
    return found


def _listening_fds(port: int) -> list[int]:
    """This process's listening TCP sockets on ``port``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue  # not a socket
        try:
            if (
                sock.type == socket.SOCK_STREAM
                and sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and sock.getsockname()[1] == port
            ):
                found.append(sock.fileno())
        except OSError:
            pass
        finally:
            sock.detach()
    return found


def _epoll_add(watch: Registration, fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    event = _EpollEvent(watch.events, watch.data)
    if libc.epoll_ctl(watch.epoll_fd, _EPOLL_CTL_ADD, fd, ctypes.byref(event)) != 0:
        errno = ctypes.get_errno()
        raise ListenerError(f"epoll_ctl could not watch the master's socket: {os.strerror(errno)}")
