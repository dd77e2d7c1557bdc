"""A frame's send on a ZeroMQ socket, and a look for frames waiting, as the request path makes them.

PERF: pyzmq's ``Socket.send`` is a Python method in front of libzmq's: it
handles the routing ids and groups of draft socket types (which the
appliance's PUSH sockets never have), then calls the compiled send through
``super()`` with keywords. Called straight, the compiled send costs a third
(0.55 µs against 1.6 here), and a frontend and a model worker each make one
or more a request. The flags are plain ints (NOBLOCK here, for sends and
receives alike): pyzmq's flag enums cost microseconds per operation.
Likewise ``Poller.poll`` is a Python method around libzmq's poll, which
costs two thirds of it called straight (1.2 µs against 1.9 here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq
from zmq.backend import Socket as _CompiledSocket
from zmq.backend import zmq_poll as _compiled_poll

NOBLOCK = int(zmq.NOBLOCK)

# send_frame(socket, frame, flags): ``frame`` copied into libzmq's message;
# raises zmq.ZMQError as ``socket.send`` does (zmq.Again: NOBLOCK, queue full).
# Not wrapped in a function of our own: that call would cost a third again.
send_frame: Callable[[zmq.Socket[Any], bytes, int], Any] = _CompiledSocket.send

# poll(items, timeout_ms): the [(socket, event mask)] of ``items`` that are
# ready, waiting up to ``timeout_ms`` (0: a look, no wait).
poll: Callable[[list[tuple[Any, int]], int], list[tuple[Any, int]]] = _compiled_poll
