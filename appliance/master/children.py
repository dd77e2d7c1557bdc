"""The master's children: what to start (ChildSpec) and what is running (Child).

Every child is a fresh interpreter (``python -m appliance child <role> ...``):
gRPC does not survive fork, and a ZeroMQ context must not cross one. Model
workers are the exception: by default the zygote forks them, before any of
that exists (see appliance/zygote.py and master/zygote.py), with the same
arguments. Each child runs in its own session so a terminal's Ctrl-C reaches
only the master. The master learns of a child's exit through a pidfd in its
selector.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from appliance.core.status import Role, SlotState, StatusTable
from appliance.core.tree import Tree
from appliance.processes.exitcodes import ExitCode

log = logging.getLogger("appliance.master")

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 30.0
# A child that ran at least this long before dying restarts at once again.
HEALTHY_RUN_S = 10.0
# After this many failures in a row a child's restarts are reported as a loop,
# once; they go on, each after a longer wait (BACKOFF_MAX_S at most).
KEEPS_FAILING = 5


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """What to start: a role, its status slot and its arguments."""

    role: str
    title: str
    slot: int
    status_role: Role
    model: str = ""
    instance: int = 0
    extra: tuple[str, ...] = ()
    # Descriptors the child inherits under their own numbers (its port's listeners).
    pass_fds: tuple[int, ...] = ()

    @property
    def is_model(self) -> bool:
        return self.status_role is Role.MODEL


class Process(Protocol):
    """What the master uses of a child process: subprocess.Popen's part, or a forked worker's."""

    @property
    def pid(self) -> int: ...

    def wait(self) -> int: ...

    def send_signal(self, sig: int) -> None: ...


# Names the cause of a child's death (the child, its pid, its exit status), or "".
Explain = Callable[["Child", int, int], str]

# Starts a model worker from ``appliance child`` arguments another way than a
# fresh exec; None when it cannot now.
Fork = Callable[[list[str]], Process | None]


class Child:
    """A child process and its restart bookkeeping."""

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.proc: Process | None = None
        self.pidfd: int | None = None
        self.generation = 0
        self.restarts = 0
        self.failures = 0
        self.started_at = 0.0
        self.next_start: float | None = 0.0
        self.stopping = False
        self.last_exit: str = ""
        self.exit_code: int | None = None
        self.load_failed = False
        # Retired by a reload: SIGTERM at retire_at, forgotten once it exits.
        self.retired = False
        self.retire_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None

    def spawn(self, tree: Tree, status: StatusTable, fork: Fork | None = None) -> int:
        """Start the process; return the pidfd to watch for its exit.

        ``fork`` starts a model worker (from the zygote); without one, or
        when it cannot, the worker starts with a fresh exec.
        """
        spec = self.spec
        self.generation = status.assign(spec.slot, spec.status_role, spec.model, spec.instance)
        if not spec.is_model:
            # A model worker clears its note once loaded; others have no load.
            status.set_note(spec.slot, "")
        # A model that failed to load will most likely fail again: no one waits for it.
        status.set_restart_at(spec.slot, 0.0 if self.load_failed else time.monotonic())
        args = [
            spec.role,
            "--tree-dir",
            str(tree.dir),
            "--master-pid",
            str(os.getpid()),
            "--slot",
            str(spec.slot),
            "--generation",
            str(self.generation),
            *spec.extra,
        ]
        proc = fork(args) if fork is not None and spec.is_model else None
        how = "forked" if proc is not None else "started"
        if proc is None:
            proc = subprocess.Popen(
                [sys.executable, "-m", "appliance", "child", *args],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=child_environment(tree),
                pass_fds=spec.pass_fds,
            )
        self.proc = proc
        self.started_at = time.monotonic()
        self.next_start = None
        self.pidfd = os.pidfd_open(proc.pid)
        log.info("%s %s (pid %d)", how, spec.title, proc.pid)
        return self.pidfd

    def reap(self, status: StatusTable, explain: Explain | None = None) -> int:
        """Collect the exit status of a child whose pidfd became readable.

        ``explain`` names the cause of a death the exit status does not tell
        (the OOM killer's SIGKILL, see oom.py); such a death counts as a
        failure, restarted with backoff however long the child ran.
        """
        assert self.proc is not None
        code = self.proc.wait()
        pid = self.proc.pid
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.proc, self.pidfd = None, None
        cause = explain(self, pid, code) if explain is not None and not self.stopping else ""
        self.last_exit = describe_exit(code) + (f": {cause}" if cause else "")
        self.exit_code = code
        ran = time.monotonic() - self.started_at
        level = logging.INFO if self.stopping or code == 0 else logging.WARNING
        log.log(level, "%s (pid %d) %s after %.1f s", self.spec.title, pid, self.last_exit, ran)
        if cause:
            status.set_note(self.spec.slot, f"{describe_exit(code)}: {cause}")
        failed = code in (ExitCode.MODEL_LOAD_ERROR, ExitCode.NO_SHARED_MEMORY)
        self.load_failed = failed
        if not self.stopping:
            # A load that fails slowly (a large import) is still no healthy run.
            healthy = ran >= HEALTHY_RUN_S and not failed and not cause
            self.failures = 0 if healthy else self.failures + 1
            delay = 0.0 if self.failures == 0 else self.backoff_s()
            self.next_start = time.monotonic() + delay
            self.restarts += 1
            if self.failures == KEEPS_FAILING:
                note = status.read(self.spec.slot).note
                log.error(
                    "%s keeps failing (%d times in a row; last: %s%s): restarts wait longer "
                    "each time, up to %.0f s",
                    self.spec.title,
                    self.failures,
                    self.last_exit,
                    f"; {note}" if note and note not in self.last_exit else "",
                    BACKOFF_MAX_S,
                )
            elif delay:
                log.info("restarting %s in %.1f s", self.spec.title, delay)
        # Clients wait for a restart due soon instead of failing (client/restarts.py).
        # Written before the state, so a client never sees DEAD with the last start's time.
        restart_at = 0.0 if failed or self.next_start is None else self.next_start
        status.set_restart_at(self.spec.slot, restart_at)
        status.set_state(self.spec.slot, SlotState.FAILED if failed else SlotState.DEAD)
        return pid

    def backoff_s(self) -> float:
        return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** (self.failures - 1))

    def send(self, signum: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def stop(self) -> None:
        """Ask the child to stop gracefully, and never restart it."""
        self.stopping = True
        self.next_start = None
        self.send(signal.SIGTERM)


def child_environment(tree: Tree) -> dict[str, str]:
    """The master's environment for a child, less systemd's notify socket.

    Only the master speaks for the service (gunicorn, for one, would
    otherwise announce its own readiness). Metrics go to the tree's
    directory, which prometheus_client reads when it is first imported.
    """
    env = {key: value for key, value in os.environ.items() if key != "NOTIFY_SOCKET"}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tree.metrics_dir)
    return env


def describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return f"was killed by {name}"
    try:
        return f"exited with {code} ({ExitCode(code).name})"
    except ValueError:
        return f"exited with {code}"
