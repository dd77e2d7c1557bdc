"""A model for fault injection: y = 2x, until a test arms a fault.

A test arms a fault by writing its name into ``<fault_dir>/armed`` (written
whole, then renamed into place). The next predict of any instance takes it
by renaming the file to ``taken-<pid>``: a rename succeeds for exactly one
caller, so exactly one batch meets the fault, whichever protocol sent it.
The taker writes the CLOCK_MONOTONIC time (the same clock in every process)
into the taken file before it acts, so the test knows when the fault hit.

Faults: ``hang`` (sleep for an hour), ``raise`` (RuntimeError), ``abort``
(os.abort(): SIGABRT, as a crashing native library would). Without a
``fault_dir`` option no fault can be armed; ``sleep_s`` makes every batch slow.

Inputs and outputs have fixed sizes, so UM-Bridge serves it too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.model import Arrays, Model, Outputs, spec

HANG_S = 3600.0


class Faulty(Model):
    """y = 2x; one batch hangs, raises or aborts when a fault is armed."""

    inputs = [spec("x", "FP64", [-1, 2])]
    outputs = [spec("y", "FP64", [-1, 2])]
    max_batch_size = 8

    def load(self) -> None:
        directory = Path(self.options.get("fault_dir", "/nonexistent"))
        self.armed = directory / "armed"
        self.taken = directory / f"taken-{os.getpid()}"
        self.sleep_s = float(self.options.get("sleep_s", 0.0))

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        fault = self._take_fault()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if fault == "hang":
            time.sleep(HANG_S)
        elif fault == "raise":
            raise RuntimeError("injected fault: this batch raises")
        elif fault == "abort":
            os.abort()
        return {"y": 2.0 * inputs["x"]}

    def _take_fault(self) -> str:
        try:
            os.rename(self.armed, self.taken)
        except FileNotFoundError:
            return ""
        fault = self.taken.read_text().strip()
        self.taken.write_text(f"{fault} {time.monotonic()!r}\n")
        return fault


def arm(fault_dir: Path, fault: str) -> None:
    """Arm ``fault`` for the next batch of any instance."""
    temp = fault_dir / "arming"
    temp.write_text(fault)
    temp.replace(fault_dir / "armed")


def taken(fault_dir: Path) -> tuple[int, float] | None:
    """Return (pid, monotonic time) of the instance that took the fault, if any."""
    for path in fault_dir.glob("taken-*"):
        parts = path.read_text().split()
        if len(parts) == 2:
            path.unlink()
            return int(path.name.removeprefix("taken-")), float(parts[1])
    return None
