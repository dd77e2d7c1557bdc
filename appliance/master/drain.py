"""The SIGTERM sequence, as numbered steps the master's loop advances.

1. Offline: every protocol's readiness turns false; requests still served.
2. Grace: keep serving for ``grace_s`` so load balancers notice.
3. Wait until nothing is in flight, bounded by ``drain_timeout_s`` from the
   start of the drain.
4. Stop the frontends (SIGTERM: gunicorn and gRPC finish what they hold),
   bounded by ``stop_timeout_s``, then SIGKILL.
5. Stop the model workers the same way, once no frontend can send them work.

A second SIGTERM or SIGINT skips to step 4 (a fast stop).
"""

from __future__ import annotations

import enum
import logging
import signal
import time
from collections.abc import Callable, Sequence

from appliance.config.settings import ServerConfig
from appliance.master.children import Child

log = logging.getLogger("appliance.master")


class Step(enum.IntEnum):
    SERVING = 0
    GRACE = 2
    WAIT_IDLE = 3
    STOP_FRONTENDS = 4
    STOP_MODELS = 5
    DONE = 6


class Drain:
    """Drive the stop sequence of one tree.

    Args:
        server: grace, drain and stop timeouts.
        set_offline: turns readiness false everywhere.
        in_flight: returns the number of requests in flight in the tree.
    """

    def __init__(
        self,
        server: ServerConfig,
        set_offline: Callable[[], None],
        in_flight: Callable[[], int],
    ) -> None:
        self.server = server
        self.set_offline = set_offline
        self.in_flight = in_flight
        self.step = Step.SERVING
        self.started = 0.0
        self.step_deadline = 0.0
        self.fast = False

    @property
    def active(self) -> bool:
        return self.step is not Step.SERVING

    @property
    def done(self) -> bool:
        return self.step is Step.DONE

    def begin(self, reason: str) -> None:
        """Start a graceful drain, or turn a running one into a fast stop."""
        if self.step is Step.SERVING:
            self.started = time.monotonic()
            self.set_offline()
            log.info(
                "%s: draining (offline now; serving %.1f s more, then waiting for requests "
                "in flight at most %.1f s in all)",
                reason,
                self.server.grace_s,
                self.server.drain_timeout_s,
            )
            self.step = Step.GRACE
        elif self.step in (Step.GRACE, Step.WAIT_IDLE):
            log.info("%s again: stopping now", reason)
            self.step = Step.WAIT_IDLE
            self.fast = True

    def advance(self, frontends: Sequence[Child], models: Sequence[Child]) -> float:
        """Move through the steps; return seconds until it needs another look."""
        now = time.monotonic()
        if self.step is Step.GRACE:
            if now < self.started + self.server.grace_s:
                return self.started + self.server.grace_s - now
            self.step = Step.WAIT_IDLE
        if self.step is Step.WAIT_IDLE:
            busy = self.in_flight()
            timed_out = now >= self.started + self.server.drain_timeout_s
            if busy and not (timed_out or self.fast):
                return 0.05
            if busy:
                log.warning("drain timeout: stopping with %d requests in flight", busy)
            self._stop_all(frontends, Step.STOP_FRONTENDS, now)
        if self.step is Step.STOP_FRONTENDS:
            if self._stopped(frontends, now):
                self._stop_all(models, Step.STOP_MODELS, now)
            else:
                return 0.05
        if self.step is Step.STOP_MODELS:
            if self._stopped(models, now):
                self.step = Step.DONE
            else:
                return 0.05
        return 1.0

    def _stop_all(self, children: Sequence[Child], step: Step, now: float) -> None:
        for child in children:
            child.stop()
        self.step = step
        self.step_deadline = now + self.server.stop_timeout_s

    def _stopped(self, children: Sequence[Child], now: float) -> bool:
        running = [child for child in children if child.running]
        if running and now >= self.step_deadline:
            for child in running:
                log.warning("%s did not stop in time; killing it", child.spec.title)
                child.send(signal.SIGKILL)
            self.step_deadline = now + self.server.stop_timeout_s
        return not running
