"""A TorchServe model store: its archives become ``[[models]]`` entries.

``torchserve --model-store DIR --models ...`` serves the archives of
``DIR`` that ``--models`` names (archive.py reads one):

- ``all``: every ``.mar`` file and every unpacked archive directory in ``DIR``,
  each named by its manifest's ``modelName`` (else its file name);
- ``NAME=FILE`` or ``FILE``: that archive (``FILE`` relative to ``DIR``), named
  ``NAME``, else by its manifest.

Without ``--models`` TorchServe serves nothing until a model is registered;
the appliance serves ``all`` (a model store given to it is meant to be
served). The store's other archives are entries too, marked
:data:`UNREGISTERED`: known, not served until the management API registers
them. Each entry runs the runtime ``appliance.runtimes.torchserve``, with
what the archive's model-config.yaml tells TorchServe's frontend:

    minWorkers       instances (1 when absent; TorchServe's default is a worker per core)
    batchSize        max_batch_size: that many requests reach the handler as one list
    maxBatchDelay    max_queue_delay_ms (TorchServe's default: 100 ms)
    responseTimeout  max_busy_s: an instance busy that long is restarted (default 120 s)

An archive that cannot be read still becomes an entry, of the runtime
``Broken``, whose load fails with the reason.

Rule: zips, JSON and YAML only (archive.py), as the other formats' readers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from appliance.formats.torchserve.archive import (
    FRONTEND_KEYS,
    SUFFIX,
    ArchiveError,
    is_archive,
    read_manifest,
    read_model_config,
)

TORCHSERVE_CLASS = "appliance.runtimes.torchserve:TorchServeModel"
BROKEN_CLASS = "appliance.runtimes.broken:Broken"
NOTES = "config_notes"
ALL = "all"
# TorchServe's service_envelope values the runtime serves ("" for none).
ENVELOPES = ("", "kserve", "kservev2")
# The option of an archive the store holds but --models did not name.
UNREGISTERED = "unregistered"
DEFAULT_BATCH_DELAY_MS = 100
DEFAULT_RESPONSE_TIMEOUT_S = 120
# model-config.yaml keys of TorchServe's frontend the appliance takes.
TAKEN = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout", "deviceType")


def is_model_store(root: Path) -> bool:
    """True when ``root`` holds a ``.mar`` file or an unpacked archive directory."""
    try:
        return any(_archive_child(child) for child in root.iterdir())
    except OSError:
        return False


def _archive_child(child: Path) -> bool:
    return not child.name.startswith(".") and is_archive(child)


def scan(root: Path, models: Sequence[str] = (), envelope: str = "") -> list[dict[str, Any]]:
    """An entry per archive ``models`` names (all of them when it is empty or
    ``all``), then one per other archive of the store, marked :data:`UNREGISTERED`."""
    wanted = [item.strip() for spec in models for item in spec.split(",") if item.strip()]
    everything = not wanted or any(item.lower() == ALL for item in wanted)
    archives = [child for child in sorted(root.iterdir()) if _archive_child(child)]
    picks: list[tuple[str | None, Path]] = []
    if everything:
        picks = [(None, child) for child in archives]
    for item in wanted:
        if item.lower() != ALL:
            name, _, file = item.rpartition("=")
            picks.append((name or None, root / file))
    named = {path.resolve() for _, path in picks}
    entries = [_entry(name, path, envelope) for name, path in picks]
    for path in archives:
        if path.resolve() not in named:
            entry = _entry(None, path, envelope)
            entry.setdefault("options", {})[UNREGISTERED] = True
            entries.append(entry)
    seen: set[str] = set()
    kept = []
    for entry in entries:
        if entry["name"] not in seen:  # `all` and a NAME=FILE of the same archive
            seen.add(entry["name"])
            kept.append(entry)
    return kept


def _entry(name: str | None, path: Path, envelope: str = "") -> dict[str, Any]:
    fallback = name or path.name.removesuffix(SUFFIX)
    if not path.exists():
        return _broken(fallback, f"{path.name}: no such archive in the model store {path.parent}")
    try:
        manifest = read_manifest(path)
        settings = read_model_config(path, manifest)
    except ArchiveError as ex:
        return _broken(fallback, str(ex))
    model = manifest["model"]
    served_as = name or str(model.get("modelName") or fallback)
    options: dict[str, Any] = {
        "path": str(path),
        "model_name": served_as,
        "version": str(model.get("modelVersion") or "1.0"),
        "stamp": _stamp(path),
    }
    if envelope:
        options["envelope"] = envelope
    notes = [f"{path.name}: model-config.yaml: {key} is not used" for key in _unused(settings)]
    if model.get("requirementsFile"):
        notes.append(
            f"{path.name}: requirementsFile {model['requirementsFile']} is not installed: "
            "install what the handler needs into the appliance's environment"
        )
    if notes:
        options[NOTES] = notes
    entry: dict[str, Any] = {
        "name": served_as,
        "class": TORCHSERVE_CLASS,
        "instances": _positive(settings.get("minWorkers"), 1),
        "options": options,
    }
    batch = _positive(settings.get("batchSize"), 1)
    if batch > 1:
        delay = settings.get("maxBatchDelay", DEFAULT_BATCH_DELAY_MS)
        entry["max_batch_size"] = batch
        options["batch_size"] = batch
        entry["max_queue_delay_ms"] = float(delay) if _number(delay) else DEFAULT_BATCH_DELAY_MS
    timeout = settings.get("responseTimeout", DEFAULT_RESPONSE_TIMEOUT_S)
    if _number(timeout) and timeout > 0:
        entry["max_busy_s"] = float(timeout)
    if str(settings.get("deviceType", "")).lower() == "gpu":
        entry["device"] = "cuda"
    return entry


def _unused(settings: Mapping[str, Any]) -> list[str]:
    return [key for key in FRONTEND_KEYS if key in settings and key not in TAKEN]


def _positive(value: object, default: int) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
    )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _stamp(path: Path) -> str:
    """The archive's size and time (its manifest's, when unpacked): a reload sees a change."""
    target = path / "MAR-INF" / "MANIFEST.json" if path.is_dir() else path
    try:
        info = os.stat(target)
    except OSError:
        return ""
    return f"{info.st_size}:{info.st_mtime_ns}"


def _broken(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "class": BROKEN_CLASS, "options": {"reason": reason}}
