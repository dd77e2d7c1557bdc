"""Tell a child the kernel's OOM killer took from one killed otherwise.

A process killed for want of memory dies of SIGKILL like one a user or the
watchdog killed. The memory cgroup the tree runs in (a container's, a
systemd unit's) counts its OOM kills: when a child dies of SIGKILL and that
count grew since the last look, the OOM killer took it. The master then
reports it as such (``appliance ctl status``, the log, readiness' reason),
with the process's RSS at the last sample, and restarts it with backoff
however long it ran. Without a readable cgroup the cause stays unknown.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("appliance.master")

CGROUP_ROOT = Path("/sys/fs/cgroup")
_OOM_KILL = re.compile(rb"^oom_kill (\d+)$", re.MULTILINE)


def events_file(proc_cgroup: str, root: Path = CGROUP_ROOT) -> Path | None:
    """Where this process's memory cgroup counts its OOM kills, if it can be read.

    Args:
        proc_cgroup: the text of /proc/self/cgroup.
        root: where the cgroup filesystems are mounted.
    """
    for line in proc_cgroup.splitlines():
        _id, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "" and (root / "cgroup.controllers").exists():
            candidate = root / relative / "memory.events"  # cgroup v2
        elif "memory" in controllers.split(","):
            candidate = root / "memory" / relative / "memory.oom_control"  # v1
        else:
            continue
        if candidate.exists():
            return candidate
    return None


def read_count(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        found = _OOM_KILL.search(path.read_bytes())
    except OSError:
        return None
    return int(found.group(1)) if found else None


class OomWatch:
    """The OOM kills of this process's memory cgroup, as seen at each child's death."""

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            try:
                path = events_file(Path("/proc/self/cgroup").read_text())
            except OSError:
                path = None
        self.path = path
        self._seen = read_count(path)
        if path is None:
            log.debug("no memory cgroup to read OOM kills from; they show as SIGKILL")

    def killed_since(self) -> bool:
        """Whether the cgroup's OOM kill count grew since the last call."""
        now = read_count(self.path)
        if now is None:
            return False
        grew = self._seen is not None and now > self._seen
        self._seen = now
        return grew
