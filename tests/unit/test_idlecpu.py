"""IdleCpu: spinning for a reply only while a CPU would otherwise idle."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from appliance.client.idlecpu import IdleCpu

BUSY = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass\n"


def test_a_host_with_more_runnable_threads_than_cpus_has_no_idle_cpu() -> None:
    cpus = len(os.sched_getaffinity(0))
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(cpus + 2)]
    idle = IdleCpu()
    try:
        deadline = time.monotonic() + 10.0
        readings = []
        while time.monotonic() < deadline and len(readings) < 50:
            readings.append(idle.available())
            time.sleep(0.02)
        # The busy loops are runnable all along: most readings see them.
        assert readings.count(False) > len(readings) // 2, readings
    finally:
        idle.close()
        for process in busy:
            process.kill()
            process.wait()


def test_close_is_idempotent_and_a_closed_reader_allows_spinning() -> None:
    idle = IdleCpu()
    idle.close()
    idle.close()
    assert idle.available()
