"""The client side of the control socket, used by ``appliance ctl``."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson

# Re-exported: `appliance ctl` and scripts catch it from here.
from appliance.errors import ControlError as ControlError


def request(path: Path, command: str, timeout_s: float = 10.0, **fields: Any) -> dict[str, Any]:
    """Send one command to the master listening at ``path``; return its reply.

    Raises:
        ControlError: nothing listens there, or the command failed.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        try:
            conn.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise ControlError(
                f"no appliance is running with control socket {path} (start one with "
                "`appliance serve`, or pass --socket / --config)"
            ) from None
        conn.sendall(orjson.dumps({"cmd": command, **fields}) + b"\n")
        # Read to the end: the master closes once it has replied, so when
        # this returns the connection is gone on its side too.
        data = bytearray()
        while chunk := conn.recv(65536):
            data += chunk
    try:
        reply: dict[str, Any] = orjson.loads(bytes(data))
    except orjson.JSONDecodeError:
        raise ControlError(
            f"the appliance sent an unreadable reply: {bytes(data)[:200]!r}"
        ) from None
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "command failed")))
    return reply
