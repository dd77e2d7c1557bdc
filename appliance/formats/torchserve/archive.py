"""TorchServe's model archives: a ``.mar`` file (a zip) or the same tree unpacked.

``torch-model-archiver`` writes ``MAR-INF/MANIFEST.json`` beside the
handler, the model file, the weights and the extra files::

    {"createdOn": "...", "runtime": "python", "archiverVersion": "0.12.0",
     "model": {"modelName": "mnist", "modelVersion": "1.0", "handler": "mnist_handler.py",
               "serializedFile": "mnist_cnn.pt", "modelFile": "mnist.py",
               "configFile": "model-config.yaml", "requirementsFile": "..."}}

Only ``handler`` is required by TorchServe's loader; ``modelName`` names
the model unless the command line names it. ``configFile`` is the
archive's ``model-config.yaml``: the worker and batch settings the
frontend reads (:data:`FRONTEND_KEYS`) and anything else, which reaches the
handler as ``context.model_yaml_config``.

Rule: this module reads zips, JSON and YAML only; the master and the config
reader call it whether or not torch is installed.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

MANIFEST = "MAR-INF/MANIFEST.json"
SUFFIX = ".mar"
# model-config.yaml keys TorchServe's frontend reads (the rest are the handler's).
FRONTEND_KEYS = (
    "minWorkers",
    "maxWorkers",
    "batchSize",
    "maxBatchDelay",
    "responseTimeout",
    "startupTimeout",
    "deviceType",
    "deviceIds",
    "parallelType",
    "parallelLevel",
    "maxRetryTimeoutInSec",
    "clientTimeoutInMills",
    "jobQueueSize",
    "useJobTicket",
    "continuousBatching",
    "sequenceMaxIdleMSec",
    "maxSequenceJobQueueSize",
    "maxNumSequence",
    "torchrun",
)


class ArchiveError(ValueError):
    """An archive that cannot be read: the message names the file and what is wrong."""


def is_archive(path: Path) -> bool:
    """A ``.mar`` file, or a directory holding ``MAR-INF/MANIFEST.json``."""
    if path.is_dir():
        return (path / MANIFEST).is_file()
    return path.suffix == SUFFIX and path.is_file()


def read_member(path: Path, name: str) -> bytes | None:
    """The bytes of ``name`` inside the archive at ``path`` (None when absent).

    Raises:
        ArchiveError: the file is not a readable zip, or the name leaves it.
    """
    if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
        raise ArchiveError(f"{path.name}: {name!r} lies outside the archive")
    if path.is_dir():
        member = path / name
        try:
            return member.read_bytes() if member.is_file() else None
        except OSError as ex:
            raise ArchiveError(f"{path.name}/{name}: cannot read it: {ex.strerror}") from None
    try:
        with zipfile.ZipFile(path) as archive:
            try:
                return archive.read(name)
            except KeyError:
                return None
    except (OSError, zipfile.BadZipFile) as ex:
        raise ArchiveError(f"{path.name}: not a model archive (a zip file): {ex}") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """The archive's manifest, with ``model.handler`` checked to be there.

    Raises:
        ArchiveError: no manifest, not JSON, or no handler named.
    """
    raw = read_member(path, MANIFEST)
    if raw is None:
        raise ArchiveError(
            f"{path.name}: no {MANIFEST}; make the archive with torch-model-archiver"
        )
    try:
        manifest: dict[str, Any] = json.loads(raw)
    except ValueError as ex:
        raise ArchiveError(f"{path.name}: {MANIFEST} is not JSON: {ex}") from None
    model = manifest.get("model") if isinstance(manifest, dict) else None
    if not isinstance(model, dict):
        raise ArchiveError(f'{path.name}: {MANIFEST} has no "model" object')
    if not isinstance(model.get("handler"), str) or not model["handler"]:
        raise ArchiveError(f"{path.name}: {MANIFEST} names no handler (model.handler)")
    return manifest


def read_model_config(path: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The archive's model-config.yaml (``model.configFile``) as a dict; {} when it has none.

    Raises:
        ArchiveError: the file is named but missing, or is not a YAML mapping.
    """
    name = manifest["model"].get("configFile")
    if not name:
        return {}
    raw = read_member(path, str(name))
    if raw is None:
        raise ArchiveError(f"{path.name}: configFile {name} is not in the archive")
    try:
        found = yaml.safe_load(raw)
    except yaml.YAMLError as ex:
        raise ArchiveError(f"{path.name}: {name} is not YAML: {_first_line(ex)}") from None
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise ArchiveError(f"{path.name}: {name}: expected a mapping of settings")
    return found


def unpack(path: Path, into: Path) -> Path:
    """The archive's files in a directory: ``path`` itself when it is one, else
    the zip extracted into ``into`` (created), every member kept inside it.

    Raises:
        ArchiveError: not a zip, a member that would land outside ``into``, or
            the extraction failed (a full disk).
    """
    if path.is_dir():
        return path
    into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                target = (root / member.filename).resolve()
                if not target.is_relative_to(root):
                    raise ArchiveError(f"{path.name}: {member.filename!r} lies outside the archive")
            archive.extractall(root)
    except (OSError, zipfile.BadZipFile) as ex:
        shutil.rmtree(root, ignore_errors=True)
        raise ArchiveError(f"{path.name}: cannot unpack it into {root}: {ex}") from None
    return root


def _first_line(ex: BaseException) -> str:
    return str(ex).strip().splitlines()[0] if str(ex).strip() else type(ex).__name__
