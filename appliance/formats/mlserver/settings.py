"""MLServer model folders: ``model-settings.json`` files become ``[[models]]`` entries.

MLServer (``mlserver start DIR``) finds its models by walking ``DIR``
recursively for files named ``model-settings.json``; each names its model
(or takes its folder's name), its runtime class (``implementation``) and,
in ``parameters``, the artefact's ``uri`` (relative to the settings file;
the settings' folder when absent) and the model's ``version``. Several
files of one name are that model's versions. A ``settings.json`` at the
root holds the server's settings.

:func:`scan` reads the files the same way into entries of the runtime
``appliance.runtimes.mlserver:MLServerModel``, which hosts the class in a
model worker. The newest version keeps the model's name and older ones are
served as ``<name>.v<version>`` (repository.py's rule); the newest is
MLServer's: whole numbers compared as numbers, other versions as strings,
and a model without a version counts as newest.

Rule: this module reads JSON and directories only, never mlserver itself
(an optional extra, imported by the runtime in the model worker), so the
master and the config reader may call it whether or not MLServer is installed.
Full validation of a settings file is MLServer's own, when the model loads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cmp_to_key
from pathlib import Path
from typing import Any

SETTINGS_FILE = "model-settings.json"
SERVER_FILE = "settings.json"
MLSERVER_CLASS = "appliance.runtimes.mlserver:MLServerModel"
BROKEN_CLASS = "appliance.runtimes.broken:Broken"
# settings.json keys the appliance takes; the others are listed when a model loads.
# parallel_workers: MLServer loads every model in each of that many processes;
# the appliance runs that many instances of each.
SERVER_KEYS_TAKEN = ("parallel_workers",)
# Those the serve command reads (ports and address), and MLServer's own defaults.
LISTEN_KEYS = {"host": "0.0.0.0", "http_port": 8080, "grpc_port": 8081, "metrics_port": 8082}
NOTES = "config_notes"
# The option that turns on MLServer's adaptive batching in the runtime.
ADAPTIVE = "adaptive_batching"


def is_mlserver_folder(root: Path) -> bool:
    """True when ``root`` holds a ``model-settings.json`` (at any depth) or a ``settings.json``.

    A Triton repository has neither; MLServer's rules apply to the rest.
    """
    if (root / SERVER_FILE).is_file() or (root / SETTINGS_FILE).is_file():
        return True
    return any(True for _ in _settings_files(root))


def _settings_files(root: Path) -> list[Path]:
    """Every model-settings.json under ``root``, as MLServer's glob finds them.

    ``glob('**/model-settings.json', recursive=True)`` skips hidden folders
    and follows links; os.walk does both when asked, and sorts for a stable order.
    """
    found = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if SETTINGS_FILE in files:
            found.append(Path(folder) / SETTINGS_FILE)
    return found


def server_settings(root: Path) -> tuple[dict[str, Any], str]:
    """``root/settings.json`` as a dict (``{}`` when absent), and why it cannot be read ("")."""
    path = root / SERVER_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as ex:
        return {}, f"{SERVER_FILE}: cannot read it: {ex}"
    if not isinstance(data, dict):
        return {}, f"{SERVER_FILE}: expected a JSON object"
    return data, ""


def listening(roots: list[Path]) -> dict[str, Any]:
    """Where ``mlserver start ROOT`` listens (host and ports), for the one MLServer
    folder in ``roots``: its settings.json's values, else MLServer's defaults;
    ``{}`` when ``roots`` is not one such folder.

    An invalid value is left to the config's own check, which names it.
    """
    if len(roots) != 1 or not roots[0].is_dir() or not is_mlserver_folder(roots[0]):
        return {}
    server, _ = server_settings(roots[0])
    found = {key: server.get(key, default) for key, default in LISTEN_KEYS.items()}
    if "host" not in server:
        del found["host"]  # the appliance's own default address
    return found


def scan(root: Path) -> list[dict[str, Any]]:
    """Return an entry per model version found under ``root``, by name then version."""
    server, problem = server_settings(root)
    instances = server.get("parallel_workers", 1)
    # MLServer's 0 runs models in its main process: one instance all the same.
    if not isinstance(instances, int) or isinstance(instances, bool) or instances < 1:
        instances = 1
    ignored = sorted(set(server) - set(SERVER_KEYS_TAKEN) - set(LISTEN_KEYS))
    notes = [problem] if problem else []
    if ignored:
        notes.append(f"{SERVER_FILE}: not used by the appliance: {', '.join(ignored)}")
    by_name: dict[str, list[tuple[str | None, Path, dict[str, Any]]]] = {}
    broken: list[dict[str, Any]] = []
    for path in _settings_files(root):
        try:
            settings = _read(path)
        except ValueError as ex:
            broken.append(_broken(path.parent.name, f"{_short(root, path)}: {ex}"))
            continue
        name = str(settings.get("name") or path.parent.name)
        version = _version(settings)
        by_name.setdefault(name, []).append((version, path, settings))
    entries: list[dict[str, Any]] = []
    for name in sorted(by_name):
        versions = sorted(by_name[name], key=cmp_to_key(_newer_last))
        for rank, (version, path, settings) in enumerate(reversed(versions)):
            served_as = name if rank == 0 else f"{name}.v{version}"
            entries.append(_entry(served_as, name, version, path, settings, instances))
    entries += broken
    if notes and entries:
        entries[0].setdefault("options", {}).setdefault(NOTES, []).extend(notes)
    return entries


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as ex:
        raise ValueError(f"cannot read it: {ex}") from None
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data


def _version(settings: Mapping[str, Any]) -> str | None:
    parameters = settings.get("parameters")
    if isinstance(parameters, Mapping) and parameters.get("version") is not None:
        return str(parameters["version"])
    return None


def _newer_last(
    a: tuple[str | None, Path, dict[str, Any]], b: tuple[str | None, Path, dict[str, Any]]
) -> int:
    """MLServer's order of versions (its registry's _is_newer): None is newest."""
    va, vb = a[0], b[0]
    if va == vb:
        return 0
    if va is None:
        return 1
    if vb is None:
        return -1
    if va.isdigit() and vb.isdigit():
        return (int(va) > int(vb)) - (int(va) < int(vb))
    return (va > vb) - (va < vb)


def _entry(
    served_as: str,
    name: str,
    version: str | None,
    path: Path,
    settings: Mapping[str, Any],
    instances: int,
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "path": str(path),
        "model_name": name,
        "version": version or "",
        "stamp": ";".join(_stamps(path, settings)),
    }
    if not settings.get("implementation"):
        reason = (
            f"{path.parent.name}/{SETTINGS_FILE}: no implementation; name the runtime "
            'class, e.g. "implementation": "mlserver_sklearn.SKLearnModel"'
        )
        return _broken(served_as, reason)
    notes = _unserved(path, settings)
    if notes:
        options[NOTES] = notes
    entry = {"name": served_as, "class": MLSERVER_CLASS, "instances": instances, "options": options}
    batch, wait = settings.get("max_batch_size", 0), settings.get("max_batch_time", 0)
    if _number(batch) and batch > 1 and _number(wait) and wait > 0:
        # MLServer's adaptive batching: up to max_batch_size requests, waiting at most
        # max_batch_time seconds for them; predict gets them merged into one request.
        entry.update(max_batch_size=int(batch), max_queue_delay_ms=float(wait) * 1000)
        options[ADAPTIVE] = True
    return entry


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _unserved(path: Path, settings: Mapping[str, Any]) -> list[str]:
    """What a model's settings ask for that the appliance does not do, for its log."""
    where = f"{path.parent.name}/{SETTINGS_FILE}"
    notes = []
    parameters = settings.get("parameters")
    for key in ("environment_path", "environment_tarball"):
        if isinstance(parameters, Mapping) and parameters.get(key):
            notes.append(f"{where}: parameters.{key} is not used: the model runs in this Python")
    if settings.get("cache_enabled"):
        notes.append(f"{where}: cache_enabled: responses are not cached")
    return notes


def _stamps(path: Path, settings: Mapping[str, Any]) -> list[str]:
    """The settings', the artefact's and models.py's size and time: a reload sees a change.

    An artefact folder (the uri's, or the settings' own when there is none)
    counts by the files MLServer's runtimes look for in it (model.*).
    """
    parameters = settings.get("parameters")
    uri = parameters.get("uri") if isinstance(parameters, Mapping) else None
    artefact = path.parent / str(uri) if uri else path.parent
    items = [path, path.parent / "models.py"]
    items += sorted(artefact.glob("model.*")) if artefact.is_dir() else [artefact]
    stamps = []
    for item in items:
        try:
            stat = item.stat()
        except OSError:
            continue
        stamps.append(f"{item.name}={stat.st_size}:{stat.st_mtime_ns}")
    return stamps


def _broken(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "class": BROKEN_CLASS, "options": {"reason": reason}}


def _short(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
