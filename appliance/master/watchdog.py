"""The hang watchdog: kill a model instance stuck in one batch too long.

A model worker writes ``busy_since`` into its status slot around each batch
(worker/batch_runner.py ``_predict``). A predict that never returns leaves it set,
and the instance serves nothing else meanwhile; a request without a deadline
would wait for ever. Once an instance has been busy longer than its model's
``max_busy_s``, the master kills it with SIGKILL: clients watching the slot
fail its requests at once with WorkerLost, and the ordinary restart (with
its backoff) brings up a fresh instance. The master checks every CHECK_S
while some model has a limit, so a kill comes at most CHECK_S late.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterable, Mapping

from appliance.config.settings import ApplianceConfig
from appliance.core.status import SlotState, StatusTable
from appliance.master.children import Child

log = logging.getLogger("appliance.master")

CHECK_S = 0.25
_WATCHED = (SlotState.READY, SlotState.STOPPING)


class Watchdog:
    """When to look next; the master's loop asks it on every turn."""

    def __init__(self) -> None:
        self.due_at = 0.0

    def wait_s(self, now: float, config: ApplianceConfig) -> float:
        """Seconds until the next check (a second when no model has a limit)."""
        if not any(model.max_busy_s for model in config.models):
            return 1.0
        return self.due_at - now

    def check(
        self, now: float, status: StatusTable, children: Iterable[Child], config: ApplianceConfig
    ) -> None:
        if now >= self.due_at:
            self.due_at = now + CHECK_S
            enforce(status, children, config)


def overdue(
    status: StatusTable,
    children: Iterable[Child],
    limits: Mapping[str, float | None],
    now: float,
) -> list[tuple[Child, float, float]]:
    """Return (child, busy seconds, limit) for each instance past its limit."""
    found = []
    for child in children:
        limit = limits.get(child.spec.model)
        if not limit or child.pid is None:
            continue
        info = status.read(child.spec.slot)
        # SAFETY: a slot's busy_since is only trusted from the process the
        # master started last; a new generation has not written it yet.
        if info.pid != child.pid or info.state not in _WATCHED or not info.busy_since:
            continue
        busy_s = now - info.busy_since
        if busy_s > limit:
            found.append((child, busy_s, limit))
    return found


def enforce(status: StatusTable, children: Iterable[Child], config: ApplianceConfig) -> int:
    """Kill every instance busy past its model's ``max_busy_s``; return how many."""
    limits = {model.name: model.max_busy_s for model in config.models}
    killed = overdue(status, children, limits, time.monotonic())
    for child, busy_s, limit in killed:
        reason = (
            f"killed by the watchdog: one batch ran {busy_s:.1f} s, over "
            f"models[{child.spec.model}].max_busy_s = {limit:g}"
        )
        log.warning("%s (pid %s) %s", child.spec.title, child.pid, reason)
        status.set_note(child.spec.slot, reason)
        child.send(signal.SIGKILL)
    return len(killed)
