"""Per-process resource figures (RSS, CPU) sampled with psutil."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    rss_bytes: int
    cpu_percent: float


class ProcessStats:
    """Sample processes; CPU percent is measured since the previous sample."""

    def __init__(self) -> None:
        self._processes: dict[int, psutil.Process] = {}
        self.figures: dict[int, ProcessFigures] = {}

    def sample(self, pids: Iterable[int]) -> None:
        wanted = set(pids)
        for pid in list(self._processes):
            if pid not in wanted:
                del self._processes[pid]
        figures = {}
        for pid in wanted:
            process = self._processes.get(pid)
            try:
                if process is None:
                    process = self._processes[pid] = psutil.Process(pid)
                with process.oneshot():
                    figures[pid] = ProcessFigures(
                        process.memory_info().rss, process.cpu_percent(interval=None)
                    )
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._processes.pop(pid, None)
        self.figures = figures

    def children_of(self, pid: int) -> list[int]:
        """Return the pids of a process's children (gunicorn's workers)."""
        try:
            return [child.pid for child in psutil.Process(pid).children()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return []
