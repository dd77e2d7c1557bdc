"""Remove shared-memory segments: this tree's at exit, dead trees' at start.

A tree is alive while its master holds the flock on its lock file (see
:mod:`appliance.core.tree`). The lock file is created under a temporary name,
locked, then renamed into place, so a sweeper never finds it unlocked while
its master is still starting.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from appliance.core.segment import SHM_DIR
from appliance.core.tree import PREFIX, Tree, owner_pid, tree_of
from appliance.processes.lifetime import pid_alive

log = logging.getLogger("appliance.master")

_YOUNG_S = 10.0


def lock_tree(tree: Tree) -> int:
    """Create and lock the tree's lock file; return its fd (keep it open)."""
    final = SHM_DIR / tree.lock_name
    temp = SHM_DIR / f"{tree.lock_name}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{os.getpid()}\n".encode())
    temp.rename(final)
    return fd


def _tree_is_dead(tree_id: str) -> bool:
    lock = SHM_DIR / f"{PREFIX}{tree_id}-lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return True
    except PermissionError:
        # Another user's appliance (its lock is 0600): not ours to judge or sweep.
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def sweep_stale(own_tree: str) -> int:
    """Unlink the segments of every dead tree; return how many were removed."""
    removed = 0
    trees: dict[str, list[Path]] = {}
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        tree_id = tree_of(path.name)
        if tree_id and tree_id != own_tree:
            trees.setdefault(tree_id, []).append(path)
    now = time.time()
    for tree_id, paths in trees.items():
        if not _tree_is_dead(tree_id):
            continue
        for path in paths:
            try:
                if path.name.endswith(".tmp") and now - path.stat().st_mtime < _YOUNG_S:
                    continue
                path.unlink()
                removed += 1
            except (FileNotFoundError, PermissionError):
                # Gone meanwhile, or another user's (/dev/shm is sticky).
                continue
    if removed:
        log.info("removed %d stale shared-memory segments of dead appliances", removed)
    return removed


def sweep_tree(tree: Tree) -> int:
    """Unlink every segment of ``tree``, its lock file included."""
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}{tree.id}-*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def sweep_process(tree: Tree, pid: int) -> int:
    """Unlink the segments a process of ``tree`` owned (it has exited)."""
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}{tree.id}-p{pid}-*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed


def sweep_dead_processes(tree: Tree, alive: set[int]) -> int:
    """Unlink segments of this tree whose owner pid is not in ``alive`` and gone."""
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}{tree.id}-p*"):
        pid = owner_pid(path.name)
        if pid is None or pid in alive or pid_alive(pid):
            continue
        path.unlink(missing_ok=True)
        removed += 1
    return removed
