"""What every child process does first: name itself and tie its life to the master.

Children run in their own session (the master starts them that way), so a
Ctrl-C in the terminal reaches only the master, which then drains the tree in
order. If the master dies, even by SIGKILL, the kernel sends each direct
child SIGTERM (``PR_SET_PDEATHSIG``), so no orphan keeps serving.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys

import setproctitle

_PR_SET_PDEATHSIG = 1


def become_child(title: str, master_pid: int) -> None:
    """Set the process title, and exit with the master.

    Args:
        title: e.g. ``model[simple#0]``; shown as ``appliance: <title>``.
        master_pid: the master's pid, to catch a master that died before the
            death signal was armed.
    """
    setproctitle.setproctitle(f"appliance: {title}")
    die_with_parent()
    if master_pid and os.getppid() != master_pid:
        sys.exit(0)
    # The master decides when the tree stops; a stray SIGINT must not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def pid_alive(pid: int) -> bool:
    """Return True if a process with this pid exists (any owner)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft descriptor limit (RLIMIT_NOFILE) to the hard one; return (before, now).

    The master does this at start and its children inherit it: systemd's and
    many containers' soft limit is 1024, far below what connections need.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, hard
