"""The MIP frontend: asyncio TCP servers on the master's listening sockets.

MIP has no model field, so each configured listener (a port) serves one
model; every MIP process accepts from every port's socket, which the master
owns and passes down (``appliance.config.listeners``), so a MIP process that dies
takes no queued connection with it. A connection may carry one
request (as KubeMo's client sends) or many, pipelined: the next request may
arrive before the last reply was read; up to PIPELINE_DEPTH of them run at
once and the replies go back in order. A ping is answered with a pong while
the host is ready (online, every model with a ready instance) and with an
INTERNAL error frame otherwise, so a TCP health check that pings sees a
draining host as down.

Limits ([mip] in the config): a frame larger than max_frame_bytes is
answered MEMORY and skipped unread; a peer silent for read_timeout_s in the
middle of a frame (or not reading its replies) is dropped; a connection idle
for idle_timeout_s is closed; beyond max_connections per process a new
connection gets a MEMORY error frame and is closed. A bad version loses the
framing: the peer gets a PROTOCOL error frame and the connection is closed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from appliance.client.api import ModelClient
from appliance.config.listeners import ListenerError, inherited
from appliance.config.settings import ApplianceConfig, MipConfig
from appliance.core.status import SlotState
from appliance.frontends import loops
from appliance.frontends.acceptor import Acceptor
from appliance.frontends.context import FrontendContext
from appliance.frontends.descriptors import Descriptors
from appliance.frontends.observe import observe_mip
from appliance.observability import logs
from appliance.processes.exitcodes import ExitCode
from appliance.processes.lifetime import become_child
from appliance.protocols.mip import codec
from appliance.protocols.mip.codec import BadVersion, ErrorCode, Event, Frame, Kind
from appliance.protocols.mip.service import MipService

log = logging.getLogger("appliance.mip")

# Requests of one connection in flight at once; reading pauses beyond it,
# or once the payloads in flight reach mip.max_frame_bytes (so a connection
# holds at most about two frames' worth of payload).
PIPELINE_DEPTH = 8
# After a fatal error: how long to keep reading (and discarding) so that the
# error frame is not lost to a reset caused by unread data.
LINGER_S = 1.0


# [auth] is on (see frontends/auth.py) and MIP cannot carry a token: a
# listener not marked trusted answers pings (health checks) and closes the
# connection at its first other frame with this PROTOCOL error.
AUTH_REFUSAL = (
    "this MIP listener is closed: the appliance requires a token ([auth]) and MIP cannot "
    "carry one; mark the listener trusted in [mip] listeners to serve it without one"
)


def auth_locked(config: ApplianceConfig, index: int) -> bool:
    """Whether MIP listener ``index`` refuses work: auth is on and it is not trusted."""
    if not config.auth.enabled:
        return False
    listeners = config.mip.listeners
    return not (index < len(listeners) and listeners[index].trusted)


class _Close:
    """The reply-queue marker: close once the replies before it are written."""


_CLOSE = _Close()
STOP_WAIT_S = 2.0


@dataclass(slots=True)
class Process:
    """What every connection of this MIP process shares."""

    client: ModelClient
    limits: MipConfig
    connections: set[MipConnection] = field(default_factory=set)
    descriptors: Descriptors = field(default_factory=lambda: Descriptors("mip"))


Reply = bytes | asyncio.Task[bytes] | _Close


class MipConnection(asyncio.BufferedProtocol):
    """One client connection: frames in, replies out in order."""

    def __init__(self, process: Process, service: MipService, locked: bool = False) -> None:
        self.process = process
        self.service = service
        # [auth] is on and this listener is not trusted: pings only (see auth.py).
        self.locked = locked
        self.limits = process.limits
        self.frames = codec.FrameReader(process.limits.max_frame_bytes)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._replies: deque[Reply] = deque()
        self._last = self.loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._advancing = False
        self._reading = True
        self._writing = True
        self._eof = False
        self._lingering = False
        self._inflight_bytes = 0

    # -- asyncio callbacks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's (server.event_loop).
        self.transport = cast(asyncio.Transport, transport)
        self._arm(self.limits.idle_timeout_s)
        connections, descriptors = self.process.connections, self.process.descriptors
        if len(connections) >= self.limits.max_connections:
            message = (
                f"too many MIP connections: this process has {len(connections)} open, "
                f"mip.max_connections is {self.limits.max_connections}"
            )
            descriptors.refuse(message)
        elif not descriptors.admit():
            message = (
                "too many MIP connections: this process is at its descriptor limit "
                f"(RLIMIT_NOFILE {descriptors.limit})"
            )
        else:
            connections.add(self)
            return
        self._replies.append(codec.encode_error(ErrorCode.MEMORY, message))
        self._replies.append(_CLOSE)
        self._advance()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.frames.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.frames.buffer_updated(nbytes)
        self._last = self.loop.time()
        self._advance()

    def eof_received(self) -> bool:
        self._eof = True
        if self._lingering:
            return False
        # Keep the transport open to write the replies still owed; _advance
        # closes it once they are written (a partial frame left is dropped).
        self._advance()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.process.connections:
            self.process.connections.discard(self)
            self.process.descriptors.closed()
        if self._timer is not None:
            self._timer.cancel()
        for reply in self._replies:
            if isinstance(reply, asyncio.Task):
                reply.cancel()
        self._replies.clear()

    def pause_writing(self) -> None:
        self._writing = False
        self._last = self.loop.time()
        self._flow()

    def resume_writing(self) -> None:
        self._writing = True
        self._last = self.loop.time()
        self._advance()

    # -- frames and replies ------------------------------------------------------------

    def _advance(self) -> None:
        """Write the replies that are ready, in order, and take new frames."""
        if self._advancing or self.transport is None or self.transport.is_closing():
            return
        self._advancing = True
        try:
            progressed = True
            while progressed:
                progressed = self._write_ready()
                while not self._lingering and self._room():
                    event = self.frames.next_event()
                    if event is None:
                        break
                    self._dispatch(event)
                    progressed = True
        finally:
            self._advancing = False
        self._flow()
        if self._eof and not self._replies and not self._lingering:
            self._close()

    def _write_ready(self) -> bool:
        assert self.transport is not None
        wrote = False
        while self._replies and not self._lingering:
            head = self._replies[0]
            if isinstance(head, asyncio.Task) and not head.done():
                break
            self._replies.popleft()
            wrote = True
            self._last = self.loop.time()
            if isinstance(head, _Close):
                self._linger()
                break
            self.transport.write(_result(head) if isinstance(head, asyncio.Task) else head)
        return wrote

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, BadVersion):
            message = (
                f"MIP version {event.header.version} is not served (only {codec.VERSION}); "
                "closing the connection"
            )
            self._replies.append(codec.encode_error(ErrorCode.PROTOCOL, message))
            self._replies.append(_CLOSE)
        elif isinstance(event, Frame) and self.locked and event.header.kind != Kind.PING:
            self._replies.append(codec.encode_error(ErrorCode.PROTOCOL, AUTH_REFUSAL))
            self._replies.append(_CLOSE)
        elif isinstance(event, Frame):
            self._replies.append(self._answer(event))
        else:
            message = (
                f"the frame's payload of {event.header.remaining} bytes exceeds "
                f"mip.max_frame_bytes ({self.limits.max_frame_bytes})"
            )
            self._replies.append(codec.encode_error(ErrorCode.MEMORY, message))

    def _answer(self, frame: Frame) -> Reply:
        error = codec.check_request(frame.header)
        if error is not None:
            return codec.encode_error(error.code, error.message)
        if frame.header.kind == Kind.PING:
            if self.process.client.server_ready():
                return codec.PONG
            return codec.encode_error(ErrorCode.INTERNAL, "the server is not ready")
        size = len(frame.payload)
        self._inflight_bytes += size
        task = self.loop.create_task(observe_mip(self.service, frame.payload))
        task.add_done_callback(lambda _task: self._finished(size))
        return task

    def _finished(self, size: int) -> None:
        self._inflight_bytes -= size
        self._advance()

    def _room(self) -> bool:
        """True while this connection may take another request."""
        return (
            len(self._replies) < PIPELINE_DEPTH
            and self._inflight_bytes < self.limits.max_frame_bytes
        )

    # -- flow control, timeouts and closing ------------------------------------------------

    def _flow(self) -> None:
        """Read while there is room for more requests and the peer reads its replies."""
        if self.transport is None or self.transport.is_closing() or self._eof:
            return
        wanted = self._lingering or (self._writing and self._room())
        if wanted != self._reading:
            self._reading = wanted
            if wanted:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _limit(self) -> float | None:
        """The silence allowed in the connection's current state."""
        if self._lingering:
            return LINGER_S
        if not self._writing:
            return self.limits.read_timeout_s
        if self._replies:
            return None
        if self.frames.mid_frame:
            return self.limits.read_timeout_s
        return self.limits.idle_timeout_s

    def _arm(self, delay_s: float) -> None:
        self._timer = self.loop.call_later(max(delay_s, 0.01), self._check_timeout)

    def _check_timeout(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        limit = self._limit()
        if limit is None:
            self._arm(self.limits.read_timeout_s)
            return
        left = self._last + limit - self.loop.time()
        if left > 0:
            self._arm(left)
        elif self._lingering or (self._writing and not self.frames.mid_frame):
            self._close()
        else:
            why = "in the middle of a frame" if self._writing else "not reading its replies"
            log.info("dropping a MIP peer silent for %.1f s %s", limit, why)
            self.abort()

    def _linger(self) -> None:
        """Send what is written, then discard input until the peer closes."""
        assert self.transport is not None
        self._lingering = True
        self.frames.close()
        for reply in self._replies:
            if isinstance(reply, asyncio.Task):
                reply.cancel()
        self._replies.clear()
        self._last = self.loop.time()
        if self._eof or not self.transport.can_write_eof():
            self._close()
            return
        self.transport.write_eof()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def pending(self) -> list[asyncio.Task[bytes]]:
        """The requests of this connection still running."""
        return [r for r in self._replies if isinstance(r, asyncio.Task) and not r.done()]

    def abort(self) -> None:
        """Drop the connection at once."""
        if self.transport is not None:
            self.transport.abort()


def _result(task: asyncio.Task[bytes]) -> bytes:
    if task.cancelled():
        return codec.encode_error(ErrorCode.INTERNAL, "the request was cancelled")
    error = task.exception()
    if error is not None:
        log.error("MIP request failed: %r", error)
        return codec.encode_error(ErrorCode.INTERNAL, "internal error (see the server log)")
    return task.result()


def parse_listeners(text: str) -> list[tuple[int, str]]:
    """Parse the master's ``port=model,...`` argument."""
    listeners = []
    for item in filter(None, text.split(",")):
        port, _, model = item.partition("=")
        listeners.append((int(port), model))
    return listeners


async def serve(
    context: FrontendContext,
    slot: int,
    listeners: list[tuple[int, str]],
    sockets: list[socket.socket],
) -> None:
    process = Process(context.client(publish_slot=slot), context.config.mip)
    host = context.config.server.host
    loop = asyncio.get_running_loop()
    acceptors = []
    for index, ((port, model), sock) in enumerate(zip(listeners, sockets, strict=True)):
        service = MipService(process.client, model)
        locked = auth_locked(context.config, index)
        factory = functools.partial(MipConnection, process, service, locked)
        acceptors.append(Acceptor(sock, factory, process.descriptors))
        log.info("listening on %s:%d for model %s", host, port, model)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    context.status.set_state(slot, SlotState.READY, os.getpid())
    try:
        await stop.wait()
    finally:
        context.status.set_state(slot, SlotState.STOPPING)
        for acceptor in acceptors:
            acceptor.close()
        # Close the connections here and let their requests finish cancelling
        # before the client goes away.
        tasks = [task for c in process.connections for task in c.pending()]
        for connection in list(process.connections):
            connection.abort()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)
        process.client.close()


def run(
    tree_dir: Path,
    master_pid: int,
    slot: int,
    listeners: list[tuple[int, str]],
    fds: list[int],
    index: int,
) -> int:
    """Serve every MIP listener, on the master's sockets ``fds``, until SIGTERM."""
    context = FrontendContext.open(tree_dir)
    title = f"mip[{index}]"
    logs.setup(title, context.config.server.log_level)
    logs.set_access_log(context.config.server.access_log)
    become_child(title, master_pid)
    try:
        sockets = [inherited(fd) for fd in fds]
    except ListenerError as ex:
        log.error("cannot serve the master's MIP sockets: %s", ex)
        return ExitCode.BOOT_ERROR
    loops.run(serve(context, slot, listeners, sockets), context.config.server.event_loop)
    return ExitCode.OK
