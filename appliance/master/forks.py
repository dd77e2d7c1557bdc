"""The master's side of the zygote (appliance/zygote.py), which forks model workers.

The zygote is a child like any other (started with a fresh exec, restarted
with backoff, shown by ``ctl status``), in a spare status slot. While it is
ready, :meth:`Zygote.fork` asks it for a model worker; the worker becomes the
master's own child (the master is a child subreaper), and the master tracks
it with a :class:`Forked` handle as it tracks a ``subprocess.Popen``: a
pidfd, ``waitpid``, signals. While the zygote is down or does not answer,
model workers start with a fresh exec.

Being a subreaper, the master also inherits orphans it never started: a
gunicorn worker whose arbiter died, a process a model started. It reaps
those (:func:`reap_orphans`) so that none stays a zombie.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson

from appliance.config.settings import ApplianceConfig
from appliance.core.status import Role, SlotState, StatusTable
from appliance.core.tree import Tree
from appliance.master.children import Child, ChildSpec

log = logging.getLogger("appliance.master")

_PR_SET_CHILD_SUBREAPER = 36
# A fork takes a few milliseconds; a zygote this slow is stuck, and is replaced.
ANSWER_TIMEOUT_S = 3.0
# How long the first model workers wait for the zygote's imports at start.
READY_TIMEOUT_S = 30.0


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children; False where the kernel refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Forked:
    """A model worker the zygote forked and the kernel handed to the master.

    It is the master's child, so its pid stays its own until the master
    waits for it: a signal sent before that cannot reach another process.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        """Wait for the exit; return the code as Popen does (-N: killed by signal N)."""
        if self.returncode is None:
            _pid, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


class ZygoteChild(Child):
    """The zygote's process: each start gets a fresh socket pair with the master."""

    def __init__(self, spec: ChildSpec) -> None:
        super().__init__(spec)
        self.channel: socket.socket | None = None

    def spawn(self, tree: Tree, status: StatusTable, fork: object = None) -> int:
        self.close_channel()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()
        self.spec = dataclasses.replace(self.spec, extra=("--socket-fd", str(fd)), pass_fds=(fd,))
        try:
            pidfd = super().spawn(tree, status)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.channel = ours
        return pidfd

    def close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


class Zygote:
    """Ask the zygote in status ``slot`` for model workers; no zygote with slot None."""

    def __init__(self, slot: int | None, status: StatusTable) -> None:
        self.status = status
        self.child: ZygoteChild | None = None
        if slot is not None:
            spec = ChildSpec(role="zygote", title="zygote", slot=slot, status_role=Role.ZYGOTE)
            self.child = ZygoteChild(spec)
        self._ids = itertools.count(1)
        self._waited = False

    @classmethod
    def for_config(
        cls, config: ApplianceConfig, allocate_slot: Callable[[], int], status: StatusTable
    ) -> Zygote:
        """The zygote ``server.model_start`` asks for, where the kernel allows it."""
        if config.server.model_start != "zygote":
            return cls(None, status)
        if not become_subreaper():
            log.warning("cannot become a child subreaper; model workers start with a fresh exec")
            return cls(None, status)
        return cls(allocate_slot(), status)

    @property
    def children(self) -> list[Child]:
        return [self.child] if self.child is not None else []

    def ready(self) -> bool:
        child = self.child
        return (
            child is not None
            and child.running
            and child.channel is not None
            and self.status.hot(child.spec.slot)[0] == SlotState.READY
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Wait once, at start, until the zygote can fork; False if it died or took too long."""
        child = self.child
        if child is None or self.ready() or self._waited:
            return self.ready()
        self._waited = True
        deadline = time.monotonic() + timeout_s
        while child.pidfd is not None and time.monotonic() < deadline:
            if self.ready():
                return True
            if select.select([child.pidfd], [], [], 0.01)[0]:
                break
        log.warning("the zygote is not ready; model workers start with a fresh exec")
        return False

    def fork(self, args: list[str]) -> Forked | None:
        """A model worker for ``appliance child`` ``args``, or None to exec one instead."""
        if not self.ready():
            return None
        child = self.child
        assert child is not None
        assert child.channel is not None
        request_id = next(self._ids)
        try:
            child.channel.send(orjson.dumps({"id": request_id, "argv": args}))
            reply = _answer(child.channel, request_id)
            if "pid" in reply:
                forked = Forked(int(str(reply["pid"])))
                # The worker starts on this word, once it is ours to watch.
                child.channel.send(orjson.dumps({"adopted": request_id}))
                return forked
        except (OSError, TimeoutError, ValueError) as ex:
            # Replaced rather than trusted: its workers wait for a word that
            # never comes, and exit once it dies (its process group, a fork
            # half done included).
            log.warning("the zygote failed to fork (%s); restarting it", ex)
            child.close_channel()
            if child.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
            return None
        log.warning("the zygote could not fork: %s", reply.get("error"))
        return None

    def close(self) -> None:
        if self.child is not None:
            self.child.close_channel()


def _answer(channel: socket.socket, request_id: int) -> dict[str, object]:
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([channel], [], [], left)[0]:
            raise TimeoutError(f"no answer in {ANSWER_TIMEOUT_S:.0f} s")
        data = channel.recv(1 << 16)
        if not data:
            raise ConnectionError("the zygote closed its socket")
        reply = orjson.loads(data)
        if reply.get("id") == request_id:
            return dict(reply)


def reap_orphans(known: Iterable[int]) -> list[int]:
    """Reap the exited children the master did not start; return their pids.

    Only pids it does not track are waited for, so no Popen or :class:`Forked`
    loses its child's exit status.
    """
    skip = set(known)
    reaped = []
    for pid in _own_children():
        if pid in skip:
            continue
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped.append(pid)
                log.info("reaped orphan %d (%s)", pid, _exit_text(status))
    return reaped


def _own_children() -> list[int]:
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += map(int, (task / "children").read_text().split())
    return pids


def _exit_text(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"
