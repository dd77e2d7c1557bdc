"""How many processes "auto" means: sized to the CPUs this process may use.

The CPUs are those of the process's affinity mask (``taskset``, systemd's
CPUAffinity, a container's cpuset), capped by a cgroup v2 CPU quota where one
is set (``cpu.max``, as a container's CPU limit). Every frontend port is the
master's, passed to the processes that serve it, so while a process that
died is replaced new connections wait in the port's queue. gRPC and MIP run
at least two processes each, so that one serves while the other restarts
(the master restarts them, a fresh interpreter each). HTTP may run one
worker: gunicorn forks its replacement at once. On a small host
a second HTTP worker costs more than it serves: with 2 CPUs, REST at 16
clients took about 1.5x the CPU per request with two workers as with one
(bench/profiles/README.md).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")

# setting -> (CPUs per process, fewest processes, most processes).
RULES: dict[str, tuple[int, int, int]] = {
    "http.workers": (2, 1, 16),
    "grpc.workers": (4, 2, 8),
    "mip.workers": (8, 2, 4),
    "instances": (4, 1, 16),
}


def usable_cpus(affinity: int | None = None, cpu_max: str | None = None) -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup quota.

    Args:
        affinity: how many CPUs the affinity mask holds; None reads it.
        cpu_max: the text of cgroup v2's cpu.max ("max 100000", "150000
            100000"); None reads it where it exists.
    """
    if affinity is None:
        affinity = len(os.sched_getaffinity(0))
    if cpu_max is None:
        try:
            cpu_max = CGROUP_CPU_MAX.read_text()
        except OSError:
            cpu_max = ""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota.isdigit() and period.isdigit() and int(period) > 0:
        affinity = min(affinity, math.ceil(int(quota) / int(period)))
    return max(1, affinity)


def auto(setting: str, cpus: int) -> int:
    """What "auto" means for ``setting`` (a key of RULES) on ``cpus`` CPUs."""
    per, fewest, most = RULES[setting]
    return max(fewest, min(most, cpus // per))


def rule_text() -> str:
    """The rule in words, for ``appliance ctl status`` and the docs."""
    return "; ".join(
        f"{setting}: one per {per} CPUs, {fewest} to {most}"
        for setting, (per, fewest, most) in RULES.items()
    )
