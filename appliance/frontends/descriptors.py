"""A frontend's connections within its descriptor limit (RLIMIT_NOFILE).

A process with no descriptor left cannot accept: the kernel keeps new
connections waiting in the listen queue while asyncio and gRPC retry every
second and log each time, and uvloop closes them unseen. Worse, the work
requests do (ZeroMQ sockets to a new model instance, a client's
shared-memory file) fails as well. So each frontend admits a connection only
while HEADROOM descriptors stay free; beyond that a new connection is closed
at once, counted in ``appliance_connections_refused_total`` and logged once
until connections are admitted again. Connections already open are served
as before.

The master raises its soft limit to the hard one at start
(``appliance.processes.lifetime.raise_descriptor_limit``), and every child inherits it.
"""

from __future__ import annotations

import logging
import os
import resource
import time

from prometheus_client import Counter

log = logging.getLogger("appliance.frontends")

# Descriptors kept free for the work requests do; sized for the few a
# request may open besides its connection (a ZeroMQ socket, a client's file).
HEADROOM = 16
# How often the descriptors that are not connections are counted again.
RECOUNT_S = 1.0
# Near the limit, they are counted at most this often.
RECOUNT_NEAR_S = 0.1

REFUSED = Counter(
    "appliance_connections_refused",
    "Connections a frontend closed at once: it was at its descriptor limit (RLIMIT_NOFILE), "
    "or (MIP) at mip.max_connections.",
    ["protocol"],
)


def soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # less listdir's own


class Descriptors:
    """Admit a process's new connections while descriptors are left for its work.

    Args:
        protocol: the label of the refusals' counter and the log line.
    """

    def __init__(self, protocol: str, limit: int | None = None) -> None:
        self.protocol = protocol
        self.limit = soft_limit() if limit is None else limit
        self.connections = 0
        self.refused = 0
        self._others = 0
        self._counted_at = float("-inf")
        self._refusing = False
        self._counter = REFUSED.labels(protocol)

    def admit(self) -> bool:
        """Count a new connection in (its descriptor already open), or refuse it.

        Refused, the caller closes it at once; admitted, it calls :meth:`closed`
        when the connection ends.
        """
        self.connections += 1
        if self._over():
            self.connections -= 1
            self.refuse(
                f"at the descriptor limit (RLIMIT_NOFILE {self.limit}; {self.connections} "
                f"connections open, {self._others} other descriptors)"
            )
            return False
        if self._refusing:
            self._refusing = False
            log.info(
                "%s: accepting connections again (%d open); %d refused so far",
                self.protocol,
                self.connections,
                self.refused,
            )
        return True

    def closed(self) -> None:
        self.connections -= 1

    def _over(self) -> bool:
        now = time.monotonic()
        near = self._others + self.connections + HEADROOM > self.limit
        since = now - self._counted_at
        if since >= RECOUNT_S or (near and since >= RECOUNT_NEAR_S):
            self._counted_at = now
            self._others = max(0, open_descriptors() - self.connections)
            near = self._others + self.connections + HEADROOM > self.limit
        return near

    def refuse(self, why: str) -> None:
        """Count a connection closed at once; log ``why`` once until one is admitted."""
        self.refused += 1
        self._counter.inc()
        if not self._refusing:
            self._refusing = True
            log.warning(
                "%s: %s: closing new connections until some close. Raise the limit "
                "(LimitNOFILE= in the systemd unit, ulimit -n, a container's --ulimit nofile=)",
                self.protocol,
                why,
            )

    def static_cap(self, reserved: int) -> int:
        """For a server that caps its connections itself (gRPC): the most it may hold.

        ``reserved``: descriptors its work may open later, besides the headroom.
        """
        return max(HEADROOM, self.limit - open_descriptors() - HEADROOM - reserved)
