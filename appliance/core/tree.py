"""Names and paths of everything one ``appliance serve`` process tree creates.

A tree has a short random id. Its shared-memory segments are
``/dev/shm/appliance-<tree>-<what>`` and its private files (config snapshot,
model metadata, ZeroMQ sockets, models loaded inline) live in ``<run_dir>/<tree>/``, mode 0700.
The master holds an exclusive ``flock`` on ``/dev/shm/appliance-<tree>-lock``
for its whole life: the kernel drops it when the master dies, even by
SIGKILL, which is how a later master knows the tree is dead and may sweep it.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

PREFIX = "appliance-"
# Unix socket paths are limited to 107 bytes on Linux.
MAX_SOCKET_PATH = 107


def new_tree_id() -> str:
    return secrets.token_hex(4)


def tree_of(segment_name: str) -> str | None:
    """Return the tree id a segment name belongs to, if it is ours."""
    if not segment_name.startswith(PREFIX):
        return None
    rest = segment_name[len(PREFIX) :]
    tree = rest.split("-", 1)[0]
    return tree or None


def owner_pid(segment_name: str) -> int | None:
    """Return the pid of a process ring's owner (``...-p<pid>...``), if any."""
    for part in segment_name.split("-"):
        if len(part) > 1 and part[0] == "p" and part[1:].isdigit():
            return int(part[1:])
    return None


@dataclass(frozen=True, slots=True)
class Tree:
    """One process tree's id and where its files go."""

    id: str
    run_dir: Path

    @property
    def dir(self) -> Path:
        return self.run_dir / self.id

    @property
    def status_name(self) -> str:
        return f"{PREFIX}{self.id}-status"

    @property
    def lock_name(self) -> str:
        return f"{PREFIX}{self.id}-lock"

    @property
    def snapshot_path(self) -> Path:
        return self.dir / "config.json"

    @property
    def control_path(self) -> Path:
        return self.run_dir / "control.sock"

    @property
    def state_path(self) -> Path:
        return self.run_dir / "appliance.json"

    def ring_name(self, pid: int | None = None, what: str = "ring") -> str:
        """Name the tensor ring owned by process ``pid``."""
        return f"{PREFIX}{self.id}-p{pid or os.getpid()}-{what}"

    def model_endpoint(self, slot: int, generation: int) -> str:
        """ZeroMQ endpoint of one model-worker generation.

        Each restart binds a new path, so a request queued for a dead worker
        can never reach its replacement.
        """
        return f"ipc://{self.dir}/m{slot}g{generation}.sock"

    @property
    def metrics_dir(self) -> Path:
        """Where every process writes its Prometheus samples."""
        return self.dir / "metrics"

    def reply_endpoint(self, pid: int, channel: int) -> str:
        """ZeroMQ endpoint where client ``pid``'s ``channel`` receives replies."""
        return f"ipc://{self.dir}/c{pid}-{channel}.sock"

    def metadata_path(self, model: str) -> Path:
        return self.dir / "models" / f"{model}.json"

    @property
    def inline_dir(self) -> Path:
        """Where models shipped inline in a load request are written.

        Each load gets ``<inline_dir>/<random>/<model>/``, a model directory
        laid out as in a model repository; the master removes it once the
        model no longer serves from it.
        """
        return self.dir / "inline"

    def check_paths(self) -> None:
        """Raise ValueError if socket paths would exceed the kernel's limit."""
        longest = f"{self.dir}/c4194304-65535.sock"
        if len(longest) > MAX_SOCKET_PATH or len(str(self.control_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"run_dir {self.run_dir} is too long for unix sockets (paths under it "
                f"reach {len(longest)} bytes; the limit is {MAX_SOCKET_PATH}); set "
                "server.run_dir to a shorter directory"
            )
