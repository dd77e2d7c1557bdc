"""A process tree's memory, counted once: what bench_models.py reads once a server idles.

Apart from the benchmark because reading /proc/<pid>/smaps_rollup and
/dev/shm is a measurement of its own, the same for the appliance and for
MLServer.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from typing import Any

import psutil

MiB = 1 << 20


def smaps(pid: int) -> dict[str, int]:
    """/proc/<pid>/smaps_rollup in bytes: Pss, Pss_Shmem, and USS (its private pages)."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                fields[key] = int(parts[0]) * 1024
    return {
        "uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
        "pss": fields.get("Pss", 0),
        "pss_shmem": fields.get("Pss_Shmem", 0),
    }


def tree_memory(root: int, shm_prefix: str | None, models: set[int]) -> dict[str, Any]:
    """The tree's memory counted once, and its model workers' USS and PSS."""
    processes = [psutil.Process(root)]
    with contextlib.suppress(psutil.Error):
        processes += processes[0].children(recursive=True)
    total = 0
    workers = []
    for process in processes:
        with contextlib.suppress(OSError):
            figures = smaps(process.pid)
            total += figures["pss"] - figures["pss_shmem"]
            if process.pid in models:
                workers.append(figures)
    shm = 0
    if shm_prefix:
        for entry in os.scandir("/dev/shm"):
            if entry.name.startswith(shm_prefix):
                with contextlib.suppress(OSError):
                    shm += entry.stat().st_blocks * 512
    return {
        "processes": len(processes),
        "processes_mib": total / MiB,
        "shm_mib": shm / MiB,
        "all_mib": (total + shm) / MiB,
        "worker_uss_mib": statistics.median(w["uss"] for w in workers) / MiB if workers else None,
        "worker_pss_mib": statistics.median(w["pss"] for w in workers) / MiB if workers else None,
    }
