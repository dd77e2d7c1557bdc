"""Signals as events of the master's loop: the wakeup pipe its selector watches.

Apart from the supervisor so that what runs in signal context is plainly
nothing: the handler is a no-op, ``signal.set_wakeup_fd`` writes each
signal's number into the pipe, and the loop calls the signal's handler when
it reads it, like any other event.
"""

from __future__ import annotations

import os
import selectors
import signal
from collections.abc import Callable, Mapping


class SignalPipe:
    """Route ``handlers``' signals through a pipe into ``selector``'s loop.

    Args:
        selector: the loop's selector; the pipe's read end is registered there.
        handlers: each signal -> what the loop calls when that signal came.
    """

    def __init__(
        self,
        selector: selectors.BaseSelector,
        handlers: Mapping[signal.Signals, Callable[[], None]],
    ) -> None:
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._fds = (read_fd, write_fd)
        self._handlers = handlers
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for signum in handlers:
            signal.signal(signum, _wake_only)
        selector.register(read_fd, selectors.EVENT_READ, self._on_signals)

    def _on_signals(self) -> None:
        try:
            data = os.read(self._fds[0], 512)
        except BlockingIOError:
            return
        for signum in data:
            handler = self._handlers.get(signal.Signals(signum))
            if handler is not None:
                handler()

    def close(self) -> None:
        """Stop writing signals into the pipe, and close it."""
        signal.set_wakeup_fd(-1)
        for fd in self._fds:
            os.close(fd)


def _wake_only(_signum: int, _frame: object) -> None:
    """Do nothing: the wakeup fd already told the loop which signal came."""
