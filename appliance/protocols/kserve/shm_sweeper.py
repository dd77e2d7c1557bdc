"""A thread that lets go of what a frontend process holds for regions unregistered elsewhere.

A region is unregistered through whichever frontend process the call lands
in; the others find out when they next read the registry, which a process
serving no shared-memory request never does. So while a process holds
anything for a region (a mapping of a client's segment, a CUDA handle), a
thread reads the registry every ``SWEEP_INTERVAL_S`` and lets go of what
went, then ends when nothing is held.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SWEEP_INTERVAL_S = 1.0


class Sweeper:
    """Runs ``refresh`` under ``lock`` every SWEEP_INTERVAL_S while ``holding()``.

    Args:
        lock: the region table's lock.
        refresh: reloads the registry and lets go of regions gone (the
            caller holds ``lock``).
        holding: whether anything is still held (the caller holds ``lock``).
        name: the thread's name.
    """

    def __init__(
        self,
        lock: threading.Lock,
        refresh: Callable[[], None],
        holding: Callable[[], bool],
        name: str,
    ) -> None:
        self._lock = lock
        self._refresh = refresh
        self._holding = holding
        self._name = name
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Sweep from now on, until nothing is held (the caller holds the lock)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(SWEEP_INTERVAL_S)
            with self._lock:
                self._refresh()
                if not self._holding():
                    self._thread = None
                    return
