"""A frame's send on a ZeroMQ socket, as the request path makes it.

PERF: pyzmq's ``Socket.send`` is a Python method in front of libzmq's: it
handles the routing ids and groups of draft socket types (which the
appliance's PUSH sockets never have), then calls the compiled send through
``super()`` with keywords. Called straight, the compiled send costs a third
(0.55 µs against 1.6 here), and a frontend and a model worker each make one
or more a request. The flags are plain ints (NOBLOCK here, for sends and
receives alike): pyzmq's flag enums cost microseconds per operation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq
from zmq.backend import Socket as _CompiledSocket

NOBLOCK = int(zmq.NOBLOCK)

# send_frame(socket, frame, flags): ``frame`` copied into libzmq's message;
# raises zmq.ZMQError as ``socket.send`` does (zmq.Again: NOBLOCK, queue full).
# Not wrapped in a function of our own: that call would cost a third again.
send_frame: Callable[[zmq.Socket[Any], bytes, int], Any] = _CompiledSocket.send
