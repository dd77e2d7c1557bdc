"""The child -> master contract: what a child's exit status means."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    # Unexpected exception; the master restarts the child with backoff.
    CRASH = 1
    # The config snapshot could not be read: restarting cannot help.
    CONFIG_ERROR = 3
    # The process could not start serving (socket in use, bad arguments).
    BOOT_ERROR = 4
    # The model could not be imported or loaded; restarted with backoff, and
    # the model is reported not ready with the reason meanwhile.
    MODEL_LOAD_ERROR = 5
    # /dev/shm had no room for the process's ring (at its smallest size); the
    # note in its status slot says how much was free. Restarted with backoff,
    # like a model that failed to load.
    NO_SHARED_MEMORY = 6
