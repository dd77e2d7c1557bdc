"""Per-process resource figures (RSS, CPU) sampled with psutil."""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from appliance.core.status import Counter, StatusTable

# The window the request rate is measured over.
RATE_WINDOW_S = 10.0


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


class RequestRate:
    """Model requests answered per second, from the status table's counters."""

    def __init__(self) -> None:
        self._totals: collections.deque[tuple[float, int]] = collections.deque()

    def sample(self, status: StatusTable, slots: Iterable[int]) -> None:
        """Add up the answered requests (successes and failures) of ``slots`` now."""
        total = 0
        for slot in slots:
            counters = status.read(slot).counters
            total += counters[Counter.SUCCESS] + counters[Counter.FAIL]
        now = time.monotonic()
        self._totals.append((now, total))
        while self._totals and now - self._totals[0][0] > RATE_WINDOW_S:
            self._totals.popleft()

    def per_s(self) -> float:
        """Over the last RATE_WINDOW_S."""
        if len(self._totals) < 2:
            return 0.0
        (first_at, first), (last_at, last) = self._totals[0], self._totals[-1]
        return (last - first) / (last_at - first_at) if last_at > first_at else 0.0
