"""What the soak samples of the tree: each process's RSS and open fds, and /dev/shm.

Apart from soak.py because reading /proc and /dev/shm is a job of its own:
each fd is named by what it refers to (a TCP peer, a unix socket's path, an
eventfd...), so that a judged growth says what grew.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

from tests.system.harness import Appliance

TCP_STATES = {"01": "established", "06": "time-wait", "08": "close-wait", "0A": "listening"}
UNIX_LISTENING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags


def fd_targets(pid: int) -> dict[int, str] | None:
    """What each open fd of ``pid`` refers to (readlink), or None once it is gone."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    targets = {}
    for name in names:
        with contextlib.suppress(OSError):  # closed meanwhile
            targets[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return targets


def socket_table() -> dict[str, str]:
    """Say what each TCP and unix socket of this host is, by its ``socket:[inode]``."""
    table = {}
    for kind in ("tcp", "tcp6"):
        for fields in _proc_net(kind):
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            where = f"{_address(local)} -> {_address(remote)}"
            table[f"socket:[{inode}]"] = f"{kind} {where} {TCP_STATES.get(state, state)}"
    for fields in _proc_net("unix"):
        inode, path = fields[6], fields[7] if len(fields) > 7 else "(unnamed)"
        listening = "listening " if int(fields[3], 16) & UNIX_LISTENING else ""
        table[f"socket:[{inode}]"] = f"unix {listening}{path}"
    return table


def _proc_net(kind: str) -> list[list[str]]:
    try:
        lines = Path(f"/proc/net/{kind}").read_text().splitlines()[1:]
    except OSError:
        return []
    return [line.split() for line in lines]


def _address(text: str) -> str:
    host, port = text.split(":")
    if len(host) == 8:  # IPv4, in the kernel's byte order
        return f"{socket.inet_ntoa(bytes.fromhex(host)[::-1])}:{int(port, 16)}"
    return f"[...]:{int(port, 16)}"


def shm_bytes(tree: str) -> tuple[int, int]:
    """Total size and count of the tree's /dev/shm files."""
    sizes = []
    for path in Path("/dev/shm").glob(f"appliance-{tree}-*"):
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            continue
    return sum(sizes), len(sizes)


def process_key(process: dict[str, Any]) -> str:
    """A process's name in the table: its role, with the pid for gunicorn's workers."""
    role = str(process["role"])
    return f"{role} {process['pid']}" if role == "http worker" else role


def sample(appliance: Appliance, started: float) -> dict[str, Any]:
    """Every process's RSS, fds and what they are, and the tree's shm.

    ``targets`` (not written to --out) maps each process to its fds'
    targets, sockets described by /proc/net, read after the fds so that
    every socket listed is there.
    """
    raw = {}
    for process in appliance.processes():
        pid = process["pid"]
        if not pid or process.get("rss_bytes") is None:
            continue  # a slot whose process is gone
        raw[process_key(process)] = (pid, process["rss_bytes"], fd_targets(pid))
    sockets = socket_table()
    processes, targets = {}, {}
    for key, (pid, rss, fds) in raw.items():
        processes[key] = {"pid": pid, "rss": rss, "fds": None if fds is None else len(fds)}
        if fds is not None:
            targets[key] = [sockets.get(target, target) for target in fds.values()]
    shm, segments = shm_bytes(appliance.tree)
    return {
        "t": round(time.monotonic() - started, 2),
        "processes": processes,
        "shm_bytes": shm,
        "shm_files": segments,
        "targets": targets,
    }
