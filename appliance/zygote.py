"""The zygote: one warm interpreter that forks model workers for the master.

A model worker started with a fresh exec pays for its own interpreter, numpy,
pyzmq and the appliance's modules: about 22 MiB of private memory and half a
second of CPU before it loads a model. The zygote imports them once; a worker
forked from it shares those pages copy-on-write. It imports no model and no
model runtime (torch, onnxruntime, CUDA), which a worker imports after the
fork, so a reload with a changed model file loads the new file.

Why the double fork: a worker must be the master's child, as an exec'd one
is, so that the master can wait for it and the worker's death signal
(``PR_SET_PDEATHSIG``) follows the master and not the zygote. The master is a
child subreaper (``PR_SET_CHILD_SUBREAPER``); the zygote forks an
intermediate, which forks the worker and exits at once, so the kernel hands
the worker to the master. The worker waits until the master has adopted it,
then runs exactly what ``python -m appliance child model ...`` runs.

The protocol, over a SOCK_SEQPACKET socket the master passes down: the master
sends ``{"id": n, "argv": [...]}`` (the arguments of ``appliance child``);
the zygote answers ``{"id": n, "pid": p}`` or ``{"id": n, "error": "..."}``;
once it tracks the pid, the master sends ``{"adopted": n}`` and the worker
starts.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import socket
import struct
import sys
import threading
import traceback
from pathlib import Path

import orjson

# Imported here, before any fork, so that every worker shares them: the
# worker's own modules and what they pull in (numpy, pyzmq, prometheus_client).
from appliance import roles
from appliance.config.reader import read_snapshot
from appliance.core.status import SlotState, StatusTable
from appliance.core.tree import Tree
from appliance.observability import logs
from appliance.processes.lifetime import become_child
from appliance.worker import main as _worker_main  # noqa: F401

log = logging.getLogger("appliance.zygote")

_PID = struct.Struct("<i")


def run(tree_dir: Path, master_pid: int, slot: int, socket_fd: int) -> int:
    """Serve fork requests on ``socket_fd`` until the master closes it."""
    tree = Tree(tree_dir.name, tree_dir.parent)
    level = "info"
    with contextlib.suppress(Exception):
        level = read_snapshot(tree.snapshot_path).server.log_level
    logs.setup("zygote", level)
    become_child("zygote", master_pid)
    channel = socket.socket(fileno=socket_fd)
    status = StatusTable.attach(tree.status_name)
    # Objects made before the fork are never freed by a worker: keep the
    # collector from writing to (and so copying) their pages in every worker.
    gc.collect()
    gc.freeze()
    status.set_state(slot, SlotState.READY, os.getpid())
    # Dropped, so that no worker inherits a mapping it would not use.
    status.close()
    log.info("ready to fork model workers (%d modules imported)", len(sys.modules))
    # request id -> the write end of a forked worker's go pipe.
    waiting: dict[int, int] = {}
    while True:
        try:
            message = channel.recv(1 << 16)
        except InterruptedError:
            continue
        if not message:
            return 0
        request = orjson.loads(message)
        if "adopted" in request:
            go = waiting.pop(request["adopted"], None)
            if go is not None:
                os.write(go, b"g")
                os.close(go)
            continue
        try:
            pid, go = _fork(request["argv"], master_pid, channel, waiting)
            waiting[request["id"]] = go
            reply: dict[str, object] = {"id": request["id"], "pid": pid}
        except OSError as ex:
            reply = {"id": request["id"], "error": f"{type(ex).__name__}: {ex}"}
        channel.send(orjson.dumps(reply))


def _fork(
    argv: list[str], master_pid: int, channel: socket.socket, waiting: dict[int, int]
) -> tuple[int, int]:
    """Fork a worker for ``argv`` through an intermediate; return its pid and its go pipe.

    The worker starts only once the master has adopted it (a byte on the go
    pipe); if the zygote dies first, the pipe closes and the worker exits,
    so a worker the master never heard of cannot serve.
    """
    # SAFETY: a fork copies only the calling thread; a lock another thread held
    # would stay locked in the worker for ever.
    assert threading.active_count() == 1, "the zygote must not run threads"
    # Whatever sits in a buffer now would be written once more by the worker.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    go_read, go_write = os.pipe()
    pid_read, pid_write = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        code = 1
        try:
            for fd in (pid_read, go_write, *waiting.values()):
                os.close(fd)
            worker = os.fork()
            if worker == 0:
                os.close(pid_write)
                _become_worker(argv, master_pid, channel, go_read)
            os.write(pid_write, _PID.pack(worker))
            code = 0
        finally:
            os._exit(code)
    os.close(pid_write)
    os.close(go_read)
    try:
        data = os.read(pid_read, _PID.size)
    finally:
        os.close(pid_read)
        # Once the intermediate is reaped, the worker is the master's child.
        os.waitpid(intermediate, 0)
    if len(data) != _PID.size:
        os.close(go_write)
        raise ChildProcessError("the intermediate process died before it forked the worker")
    pid: int = _PID.unpack(data)[0]
    return pid, go_write


def _become_worker(argv: list[str], master_pid: int, channel: socket.socket, go: int) -> None:
    """In the forked worker: wait for the master to adopt it, run the role, exit."""
    code = 1
    try:
        channel.close()
        adopted = os.read(go, 1)
        os.close(go)
        if not adopted or os.getppid() != master_pid:
            # The zygote died before the master knew of us: nobody would watch us.
            os._exit(0)
        # As an exec'd child: its own session, so a terminal's Ctrl-C reaches only the master.
        os.setsid()
        _fresh_process_state()
        code = roles.main(argv)
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _fresh_process_state() -> None:
    """Undo what a fork shares that a fresh interpreter would not."""
    # A model directory may have changed since the zygote listed it.
    importlib.invalidate_caches()
    # numpy's global generator is not reseeded at fork (the random module is):
    # every worker would otherwise draw the same numbers.
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
