"""Requests for a model whose instance is (re)starting wait for it, briefly.

A model with one instance has none ready for the second or so its worker
takes to come back after a crash. Rather than failing every request of that
second, a new request waits while an instance of its model is starting, or
has died and the master restarts it soon (see ``restart at`` in
core/status.py), for at most the model's ``restart_wait_s`` and never past
the request's own deadline; then it fails with the not-ready error it would
have got at once. A model that failed to load, was unloaded or is stopping,
or whose restart is further off than the wait allows (a crash loop's
backoff), fails at once as before. At most ``max_queue`` requests of a
model wait in one process.

Waiting polls the status table every POLL_S: a restart takes hundreds of
milliseconds, and the master publishes no event a frontend could block on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator

from appliance.client.routing import Router
from appliance.errors import ModelNotReady

POLL_S = 0.02


class RestartWaits:
    """Decide how long requests for a model with no ready instance may wait.

    Args:
        router: the client's router (instance states).
        limits: a model's (restart_wait_s, max_queue).
    """

    def __init__(self, router: Router, limits: Callable[[str], tuple[float, int]]) -> None:
        self.router = router
        self._limits = limits
        self._waiting: dict[str, int] = {}
        self._lock = threading.Lock()

    def waits(self, model: str, deadline: float) -> Generator[float, None, None]:
        """Yield how long to sleep before trying ``model`` again.

        The caller sleeps (or awaits) each interval and tries the model;
        closing the generator ends the wait.

        Raises:
            ModelNotReady: waiting cannot help (any more).
        """
        started = time.monotonic()
        wait_s, max_queue = self._limits(model)
        give_up = started + wait_s
        if deadline:
            give_up = min(give_up, deadline)
        with self._lock:
            waiting = self._waiting.get(model, 0)
            if waiting >= max_queue:
                raise ModelNotReady(
                    f"{self.router.why_not_ready(model)}; {waiting} requests already wait for "
                    f"it to start (models[{model}].max_queue)"
                )
            self._waiting[model] = waiting + 1
        try:
            while True:
                now = time.monotonic()
                # Ready counts too: an instance can turn ready between the
                # caller's failed try and this look, and deserves one more.
                hope = self.router.ready(model) or self.router.coming(model, give_up - now)
                if now >= give_up or not hope:
                    break
                yield min(POLL_S, give_up - now)
        finally:
            with self._lock:
                self._waiting[model] -= 1
        why = self.router.why_not_ready(model)
        waited = time.monotonic() - started
        raise ModelNotReady(why if waited < POLL_S else f"{why} (waited {waited:.1f} s for it)")
