"""Tell systemd how the service is doing (sd_notify), without libsystemd.

With ``Type=notify`` systemd passes ``$NOTIFY_SOCKET`` (a unix datagram
socket; a leading ``@`` means the abstract namespace). The master sends
``READY=1`` once every model is ready, ``STATUS=...`` lines as things change,
``RELOADING=1`` around a reload and ``STOPPING=1`` when it starts draining.
Outside systemd there is no socket and every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("appliance.master")


def notify(*fields: str) -> bool:
    """Send ``fields`` (e.g. ``"READY=1"``) to systemd; return True if sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
    except OSError as ex:
        log.warning("cannot notify systemd at %s: %s", address, ex)
        return False
    return True


def monotonic_usec() -> str:
    """``MONOTONIC_USEC=``, which systemd wants beside ``RELOADING=1``."""
    return f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
