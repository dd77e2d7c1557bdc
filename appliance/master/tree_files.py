"""The tree's files and shared memory: claimed and made at start-up, removed at the end.

Apart from the supervisor because none of it supervises anything: each step
reads or writes the run_dir or /dev/shm once, before the first child starts
or after the last has stopped, and :class:`StartError` says why the
appliance cannot start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

import orjson

from appliance.config.settings import ApplianceConfig
from appliance.core.segment import Space
from appliance.core.status import StatusTable
from appliance.core.tree import Tree
from appliance.errors import ShmExhausted
from appliance.master import shm, sweep
from appliance.processes.control import ControlError, request

log = logging.getLogger("appliance.master")


class StartError(Exception):
    """The appliance cannot start; the message says why."""


def claim(tree: Tree) -> int:
    """Take the run_dir for ``tree`` and lock the tree; return the lock file's fd.

    Raises:
        StartError: another appliance uses the run_dir, a path is unusable,
            or the lock file cannot be made.
    """
    _refuse_second_instance(tree)
    try:
        tree.check_paths()
    except ValueError as ex:
        raise StartError(str(ex)) from None
    tree.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        return sweep.lock_tree(tree)
    except OSError as ex:
        raise StartError(f"cannot create the tree's lock file in /dev/shm: {ex}") from None


def make_dirs(tree: Tree) -> None:
    """Sweep what dead trees left, then make the tree's own directories."""
    sweep.sweep_stale(tree.id)
    _sweep_stale_dirs(tree.run_dir)
    tree.dir.mkdir(mode=0o700)
    tree.metrics_dir.mkdir()


def make_status_table(
    config: ApplianceConfig, tree: Tree, n_slots: int
) -> tuple[StatusTable, shm.Fit]:
    """The status table, once the config's rings are known to fit /dev/shm (shm.py).

    Returns the table and the fit, which ``appliance ctl status`` reports.
    """
    fit = shm.fit(config, Space.now(), StatusTable.size(n_slots))
    if fit.refused:
        raise StartError(f"shared memory: {fit.message}")
    if fit.cap:
        log.warning("shared memory: %s", fit.message)
    try:
        status = StatusTable.create(tree.status_name, n_slots, os.getpid())
    except ShmExhausted as ex:
        raise StartError(str(ex)) from None
    status.ring_cap = fit.cap
    return status, fit


def write_state(
    tree: Tree,
    *,
    host: str,
    ports: dict[str, int],
    mip_listeners: list[tuple[int, str]],
    ready: bool,
    settled: bool,
    online: bool,
) -> None:
    """Write ``<run_dir>/appliance.json``: how to find this tree."""
    state = {
        "tree": tree.id,
        "pid": os.getpid(),
        "host": host,
        "ports": ports,
        "mip_listeners": [{"port": port, "model": model} for port, model in mip_listeners],
        "control_socket": str(tree.control_path),
        "ready": ready,
        "settled": settled,
        "online": online,
    }
    temp = tree.state_path.with_suffix(".tmp")
    temp.write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    temp.replace(tree.state_path)


def remove(tree: Tree, lock_fd: int | None) -> None:
    """Remove every file and segment of the tree, then let go of its lock."""
    removed = sweep.sweep_tree(tree)
    shutil.rmtree(tree.dir, ignore_errors=True)
    tree.state_path.unlink(missing_ok=True)
    if lock_fd is not None:
        os.close(lock_fd)
    log.debug("removed %d shared-memory segments", removed)


def _refuse_second_instance(tree: Tree) -> None:
    path = tree.control_path
    if not path.exists():
        return
    with contextlib.suppress(ControlError, OSError):
        reply = request(path, "status", timeout_s=2.0)
        raise StartError(
            f"another appliance (pid {reply.get('pid')}) is running with run_dir "
            f"{tree.run_dir}; stop it or set server.run_dir"
        )


def _sweep_stale_dirs(run_dir: Path) -> None:
    for entry in run_dir.iterdir():
        if entry.is_dir() and not (Path("/dev/shm") / f"appliance-{entry.name}-lock").exists():
            shutil.rmtree(entry, ignore_errors=True)
