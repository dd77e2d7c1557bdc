"""A model repository: directories of model files become ``[[models]]`` entries.

The layout is Triton's::

    <repository>/
      <model>/                 the model's name (letters, digits, '_', '.', '-')
        config.toml            optional: batching, instances, device, threads, tensors
        config.pbtxt           or Triton's form of it (formats/triton/config_pbtxt.py), not both
        <version>/             a whole number; which ones serve is the version policy
          model.onnx           served by ONNX Runtime  (platform onnxruntime_onnx)
          model.pt             a TorchScript module     (platform pytorch_libtorch)

:func:`scan` turns one repository into entries shaped like the config's
``[[models]]`` tables, which ``appliance.config.settings`` checks like any other. The
class of an entry is its runtime; its options carry the file's path, its
version and a stamp (size and modification time, of the model file and of
any initial-state data file), so a reload sees a new version, or a file
replaced in place, as a changed model.

This module finds a repository's models and the versions that serve; the
layout's names and error are repository_layout.py, a model directory's
config.toml or config.pbtxt is read by model_settings.py, the version policy
is model_versions.py, and one version's entry is built by version_entry.py.

An ensemble (``platform = "ensemble"`` with ``steps`` in config.toml, or
Triton's form in config.pbtxt) needs no model file; its version directory
(Triton wants an empty ``1/``) only names its version. Its entry is the
``[[models]]`` table of an ensemble (appliance/config/ensembles.py).

A model directory that cannot be served (no version, no model file, a bad
``config.toml``) still becomes an entry, of the runtime ``Broken``, whose load
fails with the reason: the appliance starts, serves the rest, and reports why
in ``appliance ctl status`` and in every protocol's not-ready error.

Rule: the repository's modules (this one and the four it names above) read
directories, TOML and (through pbtxt.py, imported only when a model has one)
config.pbtxt, and nothing else. They import no runtime (and no onnxruntime or torch), so the
master, the config and the frontends may all call them.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from appliance.config.settings import VersionPolicy
from appliance.formats.model_settings import ENSEMBLE_SETTINGS, read_settings
from appliance.formats.model_versions import parse_versions, select_versions
from appliance.formats.repository_layout import (
    CONFIG_FILE,
    ENSEMBLE,
    NOTES,
    ONNX_CLASS,
    TORCHSCRIPT_CLASS,
    RepositoryError,
)
from appliance.formats.version_entry import version_entry

BROKEN_CLASS = "appliance.runtimes.broken:Broken"
# Each runtime's Python package, and the extra that installs it.
RUNTIME_PACKAGES = {
    ONNX_CLASS: ("onnxruntime", "onnx"),
    TORCHSCRIPT_CLASS: ("torch", "torch"),
    "appliance.runtimes.mlserver:MLServerModel": ("mlserver", "mlserver"),
}

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")


def scan(
    root: Path, policy: VersionPolicy = "latest", models: Sequence[str] = (), envelope: str = ""
) -> list[dict[str, Any]]:
    """Return a ``[[models]]`` entry per served version of each model in ``root``.

    Models come in name order. When the policy serves several versions of a
    model, the newest keeps the model's name and each older one is served as
    ``<name>.v<version>``. A folder of MLServer's (model-settings.json files)
    is read by MLServer's rules instead (mlserver_settings.py), and a TorchServe
    model store (.mar archives) by TorchServe's, ``models`` naming the archives
    served and ``envelope`` TorchServe's service_envelope (torchserve/store.py).

    Raises:
        RepositoryError: ``root`` is not a readable directory, or a model
            directory's name is not a valid model name.
    """
    from appliance.formats.mlserver import (
        settings as mlserver_settings,  # JSON and directories, as this module
    )
    from appliance.formats.torchserve import store as torchserve_store

    if root.is_dir() and mlserver_settings.is_mlserver_folder(root):
        # MLServer serves every version it finds: no version policy applies.
        return mlserver_settings.scan(root)
    if models or (root.is_dir() and torchserve_store.is_model_store(root)):
        return torchserve_store.scan(root, models, envelope)
    entries: list[dict[str, Any]] = []
    for model_dir in model_dirs(root):
        entries += model_entries(model_dir, policy)
    return entries


def model_dirs(root: Path) -> list[Path]:
    """Return the model directories of a repository, by name.

    Raises:
        RepositoryError: ``root`` cannot be listed, or a name is invalid.
    """
    try:
        children = sorted(root.iterdir())
    except OSError as ex:
        raise RepositoryError(f"cannot read model repository {root}: {ex.strerror}") from None
    found = []
    for child in children:
        if child.name.startswith(".") or child.name == "__pycache__" or not child.is_dir():
            continue
        if not _NAME.match(child.name):
            raise RepositoryError(
                f"{child}: {child.name!r} is not a model name; use 1-63 letters, digits, "
                "'_', '.' or '-'"
            )
        found.append(child)
    return found


def model_entries(model_dir: Path, policy: VersionPolicy) -> list[dict[str, Any]]:
    """Return the entries of one model directory (a Broken one when it is unservable)."""
    name = model_dir.name
    try:
        settings = read_settings(model_dir)
        policy = parse_versions(settings.pop("versions", policy))
        if settings.get("platform") == ENSEMBLE:
            return [_ensemble_entry(model_dir, settings)]
        chosen = select_versions(model_dir, policy)
    except RepositoryError as ex:
        return [broken(name, str(ex))]
    entries = []
    for rank, version in enumerate(reversed(chosen)):
        served_as = name if rank == 0 else f"{name}.v{version}"
        try:
            entries.append(version_entry(served_as, model_dir / str(version), version, settings))
        except RepositoryError as ex:
            entries.append(broken(served_as, str(ex)))
    return entries


def _ensemble_entry(model_dir: Path, settings: Mapping[str, Any]) -> dict[str, Any]:
    """An ensemble's entry: its settings as a [[models]] table, at its newest version.

    Raises:
        RepositoryError: a setting that configures a worker, which an ensemble has not.
    """
    extra = sorted(set(settings) - {*ENSEMBLE_SETTINGS, NOTES})
    if extra:
        raise RepositoryError(
            f"{model_dir.name}/{CONFIG_FILE}: {extra[0]}: an ensemble has no worker to configure; "
            f"it takes {', '.join(ENSEMBLE_SETTINGS)}"
        )
    versions = sorted(
        int(child.name) for child in model_dir.iterdir() if child.name.isdigit() and child.is_dir()
    )
    entry = {"name": model_dir.name, **settings, "version": str(versions[-1] if versions else 1)}
    return entry


def missing_runtime(entry: Mapping[str, Any]) -> str | None:
    """Why ``entry``'s runtime cannot load here (its package is not installed), or None.

    Looks the package up without importing it: the master reads the config.
    """
    package, extra = RUNTIME_PACKAGES.get(entry.get("class", ""), ("", ""))
    if not package or importlib.util.find_spec(package) is not None:
        return None
    return f"{package} is not installed (pip install 'appliance[{extra}]')"


def broken(name: str, reason: str) -> dict[str, Any]:
    """Return the entry of a model that cannot be served, and why."""
    return {"name": name, "class": BROKEN_CLASS, "options": {"reason": reason}}
