"""Counts the bytecodes each Python function runs, in a process that bench/bytecodes.py
started with ``APPLIANCE_BYTECODES`` set; anywhere else it does nothing.

A real-time signal (``SIGRTMIN + 3``: gunicorn and the appliance use none of
them) turns counting on in the process's main thread, where the serving loops
run; the next one turns it off and writes the counts to
``$APPLIANCE_BYTECODES/PID.txt``: one line per function, its bytecodes and its
calls.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from types import FrameType
from typing import Any

SIGNAL = signal.SIGRTMIN + 3
_ops: Counter[str] = Counter()
_calls: Counter[str] = Counter()
_on = [False]


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def _call(frame: FrameType, event: str, arg: Any) -> Any:
    frame.f_trace_opcodes = True
    key = _where(frame)
    _calls[key] += 1

    def _opcode(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            _ops[key] += 1
        return _opcode

    return _opcode


def _toggle(signum: int, frame: FrameType | None) -> None:
    if not _on[0]:
        _ops.clear()
        _calls.clear()
        _on[0] = True
        sys.settrace(_call)
        return
    sys.settrace(None)
    _on[0] = False
    lines = [f"{_ops[key]} {_calls[key]} {key}" for key, _ in _ops.most_common()]
    path = os.path.join(os.environ["APPLIANCE_BYTECODES"], f"{os.getpid()}.txt")
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


if os.environ.get("APPLIANCE_BYTECODES"):
    signal.signal(SIGNAL, _toggle)
