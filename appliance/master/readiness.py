"""Whether the tree is ready (every frontend listens, every model serves) or settled.

Ready is what the master publishes in ``appliance.json``, tells systemd
(READY=1 the first time) and shows in ``appliance ctl status``. Settled
means every model either serves or failed to load: the tree is as ready as
it will get, and a test or a deploy script may look.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from appliance.core.status import Role, SlotState, StatusTable
from appliance.master import systemd
from appliance.master.children import Child

log = logging.getLogger("appliance.master")


class Readiness:
    """The tree's readiness as last seen, and what systemd was told of it."""

    def __init__(self) -> None:
        self.ready = False
        self.settled = False
        self._notified = False
        self._http_booted = -1  # the HTTP arbiter generation whose workers all booted

    def update(
        self,
        status: StatusTable,
        frontends: Iterable[Child],
        layout: Mapping[str, list[int]],
        http_workers_alive: Callable[[], int],
        http_workers: int,
    ) -> bool:
        """Look again; return True when ready or settled changed (and log it)."""
        listening = self._frontends_ready(status, frontends, http_workers_alive, http_workers)
        ready = listening and _models_ready(status, layout, or_failed=False)
        settled = ready or (listening and _models_ready(status, layout, or_failed=True))
        if ready == self.ready and settled == self.settled:
            return False
        self.ready, self.settled = ready, settled
        text = (
            "all models and frontends are ready"
            if ready
            else "not ready" + (" (a model failed to load)" if settled else "")
        )
        log.info("%s", text)
        if ready and not self._notified:
            # systemd waits for this before it counts the service as started.
            self._notified = systemd.notify("READY=1", f"STATUS={text}")
        else:
            systemd.notify(f"STATUS={text}")
        return True

    def _frontends_ready(
        self,
        status: StatusTable,
        frontends: Iterable[Child],
        http_workers_alive: Callable[[], int],
        http_workers: int,
    ) -> bool:
        """Every frontend listens, and every gunicorn worker of the arbiter booted once.

        The arbiter is up before it forks its workers; ready at that point
        would send a balancer's first requests to one worker while the
        others still import. Later, a worker gunicorn replaces must not
        flap readiness, so the count is checked once per arbiter generation.
        """
        for child in frontends:
            if status.hot(child.spec.slot)[0] != SlotState.READY:
                return False
            if child.spec.status_role is Role.HTTP and self._http_booted != child.generation:
                if http_workers_alive() < http_workers:
                    return False
                self._http_booted = child.generation
        return True


def _models_ready(status: StatusTable, layout: Mapping[str, list[int]], or_failed: bool) -> bool:
    """Every model has a ready instance; with ``or_failed``, or all its instances failed."""
    accepted = {SlotState.READY, SlotState.FAILED} if or_failed else {SlotState.READY}
    return all(any(status.hot(slot)[0] in accepted for slot in slots) for slots in layout.values())
