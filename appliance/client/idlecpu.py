"""Whether a CPU would sit idle now: when spinning for a reply costs nothing.

A thread that polls for its reply instead of sleeping saves the wake-up of
an idle vCPU (see ``channel``), but only while some CPU has nothing else to
run. With more runnable threads than CPUs (many client processes, a busy
host) a spin takes the CPU from the model worker that would produce the
reply. The kernel's count of runnable threads is in ``/proc/loadavg``
(fourth field, "running/total"); one ``pread`` of it costs about a
microsecond, so it is read again at each wait.
"""

from __future__ import annotations

import contextlib
import os

LOADAVG = "/proc/loadavg"


class IdleCpu:
    """Reads the runnable count against the CPUs this process may use."""

    def __init__(self) -> None:
        self._cpus = len(os.sched_getaffinity(0))
        try:
            self._fd: int | None = os.open(LOADAVG, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def available(self) -> bool:
        """True if the runnable threads (this one included) fit the CPUs.

        Without ``/proc/loadavg`` it answers True: spinning stays bounded.
        """
        if self._fd is None:
            return True
        try:
            running = int(os.pread(self._fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return True
        return running <= self._cpus

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
