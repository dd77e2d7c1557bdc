"""Claiming a status slot for a process the master did not start itself.

gunicorn forks its workers; each claims a free slot in the range the master
reserved for them. A slot is free when it is empty or its pid is dead. An
flock on a file in the tree directory serialises claims between workers
that start at the same moment.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from appliance.core.status import Role, SlotState, StatusTable
from appliance.processes.lifetime import pid_alive


def claim_slot(status: StatusTable, first: int, count: int, lock_dir: Path, role: Role) -> int:
    """Take a free slot in ``[first, first + count)`` for this process.

    Raises:
        RuntimeError: every slot in the range is held by a live process.
    """
    with (lock_dir / "slots.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for slot in range(first, first + count):
            info = status.read(slot)
            if info.state is SlotState.EMPTY or not pid_alive(info.pid):
                status.assign(slot, role, name=role.name.lower())
                status.set_state(slot, SlotState.READY, os.getpid())
                return slot
    raise RuntimeError(f"no free status slot among {count} from {first}")
