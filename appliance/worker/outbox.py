"""What a model worker sends back: replies to client channels, and the ring space they lease.

A reply's outputs lie in the worker's response ring until the client that
got them gives them back (a RELEASE message). Each block is leased to that
client's pid, and only that pid may give it back; a client that dies gives
back all it held (server.py notices, and calls :meth:`Outbox.drop_client`).
Replies go out on one PUSH socket per client channel, connected on first use.

PERF: replies wait in the outbox until the server flushes it (server.py:
once a batch's replies are made, and at the end of its loop turn). A batch's
replies to one channel go as one frame (descriptor.join_frames): one send
and one wake-up of each side's ZeroMQ I/O thread, where each reply cost one
of each.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq

from appliance.core.descriptor import Message, join_frames, to_frame
from appliance.core.ring import Block, Ring
from appliance.core.zmq_send import NOBLOCK, send_frame

CLOSE_LINGER_MS = 2000


def reply_to(request: Message) -> tuple[int, int]:
    """The client channel (pid, number) that a request's replies go to."""
    return (request.pid, request.channel)


class Outbox:
    """A worker's reply sockets and the leases of its response ring.

    Args:
        context: the worker's ZeroMQ context.
        reply_endpoint: where a client channel (pid, number) takes replies.
        ring: the worker's response ring.
    """

    def __init__(
        self, context: zmq.Context[Any], reply_endpoint: Callable[[int, int], str], ring: Ring
    ) -> None:
        self._context = context
        self._endpoint = reply_endpoint
        self._ring = ring
        self._pushes: dict[tuple[int, int], zmq.Socket[bytes]] = {}
        self.leases: dict[Block, int] = {}
        # Replies not sent yet, by channel: their frames and the blocks they lease.
        self._queued: dict[tuple[int, int], tuple[list[bytes], list[Block]]] = {}
        # When the oldest of them was queued (time.monotonic()); 0.0 when none is.
        self.holding_since = 0.0

    def send(self, message: Message, to: tuple[int, int], blocks: list[Block]) -> None:
        """Queue ``message`` for the channel ``to``, leasing ``blocks`` to its pid;
        it goes with the next :meth:`flush`."""
        for block in blocks:
            self.leases[block] = to[0]
        queued = self._queued.get(to)
        if not self._queued:
            self.holding_since = time.monotonic()
        if queued is None:
            self._queued[to] = ([to_frame(message)], list(blocks))
        else:
            queued[0].append(to_frame(message))
            queued[1].extend(blocks)

    def flush(self) -> None:
        """Send every queued reply: one frame per channel."""
        if not self._queued:
            return
        queued, self._queued = self._queued, {}
        self.holding_since = 0.0
        for to, (frames, blocks) in queued.items():
            try:
                send_frame(self._push_to(to), join_frames(frames), NOBLOCK)
            except zmq.ZMQError:
                # The client's channel has stopped reading (its queue is full):
                # nobody will release these blocks, so take them back now.
                self.release(to[0], blocks)

    def release(self, pid: int, blocks: list[Block]) -> None:
        for block in blocks:
            # SAFETY: only the client a block was leased to may give it back.
            if self.leases.get(block) == pid:
                del self.leases[block]
                self._ring.release(block)

    def owners(self) -> set[int]:
        """The pids that hold blocks of the ring now."""
        return set(self.leases.values())

    def drop_client(self, pid: int) -> None:
        """Take back all a dead client held, and close its channels' sockets."""
        self.release(pid, [b for b, owner in self.leases.items() if owner == pid])
        for to in [to for to in self._pushes if to[0] == pid]:
            self.forget_channel(to)

    def _push_to(self, to: tuple[int, int]) -> zmq.Socket[bytes]:
        """The socket to a client channel (pid, number), connected on first use."""
        socket = self._pushes.get(to)
        if socket is None:
            socket = self._context.socket(zmq.PUSH)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(self._endpoint(*to))
            self._pushes[to] = socket
        return socket

    def forget_channel(self, to: tuple[int, int]) -> None:
        if to in self._queued:
            self.flush()
        socket = self._pushes.pop(to, None)
        if socket is not None:
            socket.close(0)

    def close(self) -> None:
        """Close every reply socket, flushing what it holds."""
        self.flush()
        for socket in self._pushes.values():
            # SAFETY: the last replies may still be queued in libzmq; a zero
            # linger would drop them with the socket.
            socket.close(linger=CLOSE_LINGER_MS)
        self._pushes.clear()
