"""Scans over the status table's slots: requests in flight, and gunicorn's HTTP workers.

Apart from the supervisor because each is a walk over a range of slots that
needs the table and the range alone. gunicorn forks its HTTP workers, so
the master never sees them start or exit: the status table is all it knows
of them.
"""

from __future__ import annotations

from appliance.core.status import Role, SlotState, StatusTable
from appliance.processes.lifetime import pid_alive


def in_flight(status: StatusTable, n_slots: int) -> int:
    """Requests queued in model workers or in flight in frontends."""
    total = 0
    for slot in range(n_slots):
        state, role, _instance, _pid, _generation, depth = status.hot(slot)
        if state in (SlotState.READY, SlotState.STOPPING) and role != Role.NONE:
            total += depth
    return total


def http_worker_pids(status: StatusTable, slots: tuple[int, int]) -> list[int]:
    """The pids of the ready HTTP workers in ``slots`` (the first, and how many)."""
    first, count = slots
    pids = []
    for slot in range(first, first + count):
        info = status.read(slot)
        if info.state is SlotState.READY and info.pid:
            pids.append(info.pid)
    return pids


def forget_dead_http_workers(status: StatusTable, slots: tuple[int, int]) -> None:
    """Free the slots of gunicorn workers that died (killed, or orphaned).

    gunicorn forks them, so the master sees no exit; left alone, their
    last in-flight count would hold up a drain.
    """
    first, count = slots
    for slot in range(first, first + count):
        state, _role, _instance, pid, _generation, _depth = status.hot(slot)
        if state != SlotState.EMPTY and pid and not pid_alive(pid):
            status.clear(slot)
