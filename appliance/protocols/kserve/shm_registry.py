"""The host-wide registry file of KServe's shared-memory regions, and a process's copy of it.

SPEC: PROTOCOL-FACTS §2.4. A register over HTTP lands in one frontend
process, the inference that names the region over gRPC in another, so the
registry is one small JSON file in the tree's private directory, changed
under an exclusive ``flock`` and replaced atomically by rename; each process
caches it by (inode, mtime). Apart from shm.py, which answers the
extension's calls, so that the file's records and the rules for changing it
across processes are in one place (the model workers read the same file:
worker/cuda_regions.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from appliance.protocols.kserve.errors import RegionExists, RegionNotFound

# The model workers read it too (worker/cuda_regions.py).
REGISTRY_FILE = "kserve-shm.json"
LOCK_FILE = "kserve-shm.lock"


@dataclass(frozen=True, slots=True)
class Region:
    """A registered region: part of a client's segment."""

    name: str
    key: str
    offset: int
    byte_size: int
    device: int
    inode: int
    serial: int

    def status(self) -> dict[str, Any]:
        """Return the region as the status call reports it."""
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass(frozen=True, slots=True)
class CudaRegion:
    """A registered CUDA region: a client's device buffer, by its IPC handle."""

    name: str
    raw_handle: str  # base64 of the handle's 64 bytes
    device_id: int
    byte_size: int
    serial: int

    def status(self) -> dict[str, Any]:
        """Return the region as the status call reports it."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


class RegistryView:
    """This process's copy of the registry, and the changes it writes to the file.

    The copy (``_regions``, ``_cuda``) is no thread's own: a subclass reloads
    and reads it under a lock of its own. Changes take the file's lock.

    Args:
        directory: the tree's private directory (``client.tree.dir``).
    """

    def __init__(self, directory: Path) -> None:
        self._path = directory / REGISTRY_FILE
        self._path_text = str(self._path)  # stat'ed on every request: no pathlib there
        self._lock_path = directory / LOCK_FILE
        self._seen: tuple[int, int, int] | None = None
        self._regions: dict[str, Region] = {}
        self._cuda: dict[str, CudaRegion] = {}

    def _add(
        self, kind: str, name: str, make: Callable[[int], Region | CudaRegion]
    ) -> Region | CudaRegion:
        """Write a new region of ``kind`` ("regions" or "cuda") under the next serial.

        Raises:
            RegionExists: ``name`` is taken by a region of either kind.
        """
        with self._exclusive() as data:
            _check_free(data, name)
            data["serial"] += 1
            region = make(data["serial"])
            data[kind][name] = asdict(region)
        return region

    def _drop(self, kind: str, name: str, serial: int) -> None:
        """Forget region ``name`` of ``kind`` if it is still the one numbered ``serial``."""
        with self._exclusive() as data:
            if data[kind].get(name, {}).get("serial") == serial:
                del data[kind][name]

    def _remove(self, kind: str, name: str | None) -> None:
        """Forget region ``name`` of ``kind`` (every one when None), if it is there."""
        with self._exclusive() as data:
            if name is None:
                data[kind].clear()
            else:
                data[kind].pop(name, None)

    def _region(self, name: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise RegionNotFound(
                f"no system shared memory region named {name!r} is registered; register it first"
            )
        return region

    def _reload(self) -> bool:
        """Read the registry again if another process changed it; whether it did."""
        try:
            info = os.stat(self._path_text)
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            seen = (0, 0, 0)
        if seen == self._seen:
            return False
        data = _read(self._path)
        self._regions = {name: Region(**fields) for name, fields in data["regions"].items()}
        self._cuda = {name: CudaRegion(**fields) for name, fields in data["cuda"].items()}
        self._seen = seen
        return True

    @contextlib.contextmanager
    def _exclusive(self) -> Any:
        """Yield the registry for a change, under the lock; write it back after."""
        with open(self._lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = _read(self._path)
            yield data
            temp = self._path.with_name(f".{REGISTRY_FILE}.{os.getpid()}.tmp")
            temp.write_bytes(orjson.dumps(data))
            temp.replace(self._path)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        data = {}
    data.setdefault("regions", {})
    data.setdefault("cuda", {})
    data.setdefault("serial", 0)
    return dict(data)


def _check_free(data: dict[str, Any], name: str) -> None:
    """Refuse (RegionExists) a name either kind holds: they share one namespace."""
    for kind, label in (("regions", "system"), ("cuda", "CUDA")):
        if name in data[kind]:
            raise RegionExists(
                f"shared memory region {name!r} is already registered (as a {label} "
                "region); unregister it first"
            )
