"""The control socket: a unix stream socket that ``appliance ctl`` talks to.

One request per connection, newline-delimited JSON both ways::

    -> {"cmd": "status"}\\n
    <- {"ok": true, ...}\\n

so an operator can also use ``socat``. The socket is mode 0600. The master
serves it from its selector loop without blocking: a client that stalls
only loses its own connection.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("appliance.master")

MAX_REQUEST_BYTES = 64 * 1024
Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlServer:
    """Accept control connections and dispatch ``cmd`` to a handler.

    Args:
        path: where to bind; a stale socket file there is replaced.
        handlers: command name -> function(request) -> reply fields.
        selector: the master's selector to register with.
    """

    def __init__(
        self, path: Path, handlers: Mapping[str, Handler], selector: selectors.BaseSelector
    ) -> None:
        self.path = path
        self.handlers = handlers
        self.selector = selector
        self._buffers: dict[socket.socket, bytearray] = {}
        path.unlink(missing_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self.listener.bind(str(path))
        finally:
            os.umask(old_umask)
        self.listener.listen(16)
        self.listener.setblocking(False)
        selector.register(self.listener, selectors.EVENT_READ, self._accept)

    def _accept(self) -> None:
        try:
            conn, _addr = self.listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        self._buffers[conn] = bytearray()
        self.selector.register(conn, selectors.EVENT_READ, lambda: self._read(conn))

    def _read(self, conn: socket.socket) -> None:
        buffer = self._buffers[conn]
        try:
            chunk = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        buffer += chunk
        if chunk and b"\n" not in buffer and len(buffer) < MAX_REQUEST_BYTES:
            return
        line = bytes(buffer).split(b"\n", 1)[0]
        reply = self._handle(line) if line else {"ok": False, "error": "empty request"}
        self._close(conn, orjson.dumps(reply) + b"\n")

    def _handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = orjson.loads(line)
            command = str(request["cmd"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return {"ok": False, "error": 'expected a JSON object with "cmd"'}
        handler = self.handlers.get(command)
        if handler is None:
            known = ", ".join(sorted(self.handlers))
            return {"ok": False, "error": f"unknown command {command!r}; known: {known}"}
        try:
            return {"ok": True, **handler(request)}
        except (ValueError, RuntimeError) as ex:
            # A refusal (a bad argument, an invalid config, a reload running):
            # its message says it all, for the log and for the caller.
            log.warning("control command %s refused: %s", command, ex)
            return {"ok": False, "error": str(ex)}
        except Exception as ex:
            log.exception("control command %s failed", command)
            return {"ok": False, "error": f"{type(ex).__name__}: {ex}"}

    def _close(self, conn: socket.socket, reply: bytes) -> None:
        self.selector.unregister(conn)
        self._buffers.pop(conn, None)
        try:
            conn.settimeout(1.0)
            conn.sendall(reply)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        for conn in list(self._buffers):
            self.selector.unregister(conn)
            conn.close()
        self._buffers.clear()
        self.selector.unregister(self.listener)
        self.listener.close()
        self.path.unlink(missing_ok=True)
