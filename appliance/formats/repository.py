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

An ensemble (``platform = "ensemble"`` with ``steps`` in config.toml, or
Triton's form in config.pbtxt) needs no model file; its version directory
(Triton wants an empty ``1/``) only names its version. Its entry is the
``[[models]]`` table of an ensemble (appliance/config/ensembles.py).

A model directory that cannot be served (no version, no model file, a bad
``config.toml``) still becomes an entry, of the runtime ``Broken``, whose load
fails with the reason: the appliance starts, serves the rest, and reports why
in ``appliance ctl status`` and in every protocol's not-ready error.

Rule: this module reads directories, TOML and (through pbtxt.py, imported
only when a model has one) config.pbtxt, and nothing else. It imports no
runtime (and no onnxruntime or torch), so the master, the config and the
frontends may all call it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from appliance.config import device as devices
from appliance.config import scheduling, warmup
from appliance.config.settings import VersionPolicy
from appliance.core.sequences import read_controls, read_states

ONNX_CLASS = "appliance.runtimes.onnx:OnnxModel"
TORCHSCRIPT_CLASS = "appliance.runtimes.torchscript:TorchScriptModel"
PYTHON_CLASS = "appliance.runtimes.python_backend:PythonBackendModel"
BROKEN_CLASS = "appliance.runtimes.broken:Broken"
CONFIG_FILE = "config.toml"
PBTXT_FILE = "config.pbtxt"

# Platform (Triton's names, and short ones) -> (model file name, runtime).
PLATFORMS: dict[str, tuple[str, str]] = {
    "onnxruntime_onnx": ("model.onnx", ONNX_CLASS),
    "onnx": ("model.onnx", ONNX_CLASS),
    "pytorch_libtorch": ("model.pt", TORCHSCRIPT_CLASS),
    "torchscript": ("model.pt", TORCHSCRIPT_CLASS),
    # Triton's Python backend: a model.py defining TritonPythonModel.
    "python": ("model.py", PYTHON_CLASS),
}
MODEL_FILES = {"model.onnx": ONNX_CLASS, "model.pt": TORCHSCRIPT_CLASS, "model.py": PYTHON_CLASS}
# Each runtime's Python package, and the extra that installs it.
RUNTIME_PACKAGES = {
    ONNX_CLASS: ("onnxruntime", "onnx"),
    TORCHSCRIPT_CLASS: ("torch", "torch"),
    "appliance.runtimes.mlserver:MLServerModel": ("mlserver", "mlserver"),
}

# What a model's config.toml may hold, and the check of each value.
SETTINGS = (
    "platform",
    "versions",
    "instances",
    "max_batch_size",
    "max_queue_delay_ms",
    "threads",
    "device",
    "description",
    "inputs",
    "outputs",
    "model_file",
    "max_queue",
    "sequence_batching",
    "max_sequence_idle_s",
    "sequence_strategy",
    "max_candidate_sequences",
    "sequence_controls",
    "sequence_state",
    "steps",
    "warmup",
    "scheduling",
    "response_cache",
    "reshape",
)
ENSEMBLE = "ensemble"
# What an ensemble's config.toml may hold (the rest configure a worker).
ENSEMBLE_SETTINGS = ("platform", "steps", "inputs", "outputs", "max_batch_size", "description")
# These go to the [[models]] entry itself; the rest become runtime options.
ENTRY_KEYS = (
    "instances",
    "max_batch_size",
    "max_queue_delay_ms",
    "device",
    "max_queue",
    "sequence_batching",
    "max_sequence_idle_s",
    "sequence_strategy",
    "max_candidate_sequences",
)
# Fields of a config.pbtxt the appliance does not use, logged by the runtime at load.
NOTES = "config_notes"

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")


class RepositoryError(ValueError):
    """A repository or one of its models cannot be read; the message says why."""


def parse_versions(raw: object) -> VersionPolicy:
    """Check a version policy: "latest", "all", or a list of version numbers.

    Raises:
        RepositoryError: anything else.
    """
    if raw in ("latest", "all"):
        assert isinstance(raw, str)
        return raw
    if (
        isinstance(raw, list | tuple)
        and raw
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in raw)
    ):
        return tuple(sorted(set(raw)))
    raise RepositoryError(
        f'expected "latest", "all" or a non-empty list of version numbers, got {raw!r}'
    )


def scan(root: Path, policy: VersionPolicy = "latest") -> list[dict[str, Any]]:
    """Return a ``[[models]]`` entry per served version of each model in ``root``.

    Models come in name order. When the policy serves several versions of a
    model, the newest keeps the model's name and each older one is served as
    ``<name>.v<version>``. A folder of MLServer's (model-settings.json files)
    is read by MLServer's rules instead (mlserver_settings.py).

    Raises:
        RepositoryError: ``root`` is not a readable directory, or a model
            directory's name is not a valid model name.
    """
    from appliance.formats.mlserver import (
        settings as mlserver_settings,  # JSON and directories, as this module
    )

    if root.is_dir() and mlserver_settings.is_mlserver_folder(root):
        # MLServer serves every version it finds: no version policy applies.
        return mlserver_settings.scan(root)
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
            entries.append(_entry(served_as, model_dir / str(version), version, settings))
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


def read_settings(model_dir: Path) -> dict[str, Any]:
    """Read and check ``<model_dir>/config.toml`` or ``config.pbtxt``; ``{}`` when there is none.

    Raises:
        RepositoryError: both files are there, or one cannot be read, is not
            TOML (or a Triton model config) or holds an invalid value.
    """
    path = model_dir / CONFIG_FILE
    pbtxt_path = model_dir / PBTXT_FILE
    if path.exists() and pbtxt_path.exists():
        raise RepositoryError(
            f"{model_dir.name}/ holds both {CONFIG_FILE} and {PBTXT_FILE}; keep one "
            f"({PBTXT_FILE} is Triton's form, {CONFIG_FILE} the appliance's)"
        )
    notes: list[str] = []
    try:
        if pbtxt_path.exists():
            path = pbtxt_path
            settings, notes = _read_pbtxt(model_dir)
        else:
            with path.open("rb") as stream:
                settings = tomllib.load(stream)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as ex:
        raise RepositoryError(f"{_short(path)}: cannot read it: {ex}") from None
    for key, value in settings.items():
        problem = _check_setting(key, value)
        if problem:
            raise RepositoryError(f"{_short(path)}: {key}: {problem}")
    implicit = "sequence_controls" in settings or "sequence_state" in settings
    # The worker fills these inputs per step of a sequence: nothing else can.
    if implicit and settings.setdefault("sequence_batching", True) is not True:
        raise RepositoryError(
            f"{_short(path)}: sequence_batching: false, but sequence_controls or "
            "sequence_state declare inputs only a sequence's steps fill"
        )
    _check_with_batch_size(settings, model_dir, path)
    if notes:
        settings[NOTES] = [f"{_short(path)}: {note}" for note in notes]
    return settings


# The tables' keys that config.pbtxt names otherwise (pbtxt.py reads one into the other).
_PBTXT_NAMES = {
    "scheduling": "dynamic_batching",
    "preferred_batch_sizes": "preferred_batch_size",
    "default_timeout_us": "default_timeout_microseconds",
    "warmup[": "model_warmup[",
    "timeout_action: expected 'reject' or 'delay'": "timeout_action: expected REJECT or DELAY",
}


def _check_with_batch_size(settings: Mapping[str, Any], model_dir: Path, path: Path) -> None:
    """Check the tables whose checks need the model's max_batch_size (-1 where the
    settings leave it to the model file: the worker checks them again once loaded).

    Raises:
        RepositoryError: a scheduling or warmup table is wrong (the key named).
    """
    if "scheduling" in settings and settings.get("sequence_batching"):
        raise RepositoryError(
            f"{_short(path)}: scheduling: a sequence model's queue follows its sequences; "
            "priorities and queue policies are dynamic batching's"
        )
    batch = settings.get("max_batch_size", -1)
    problems: dict[str, Callable[[object], str]] = {
        "scheduling": lambda table: scheduling.check(table, batch),
        "warmup": lambda table: warmup.check(table, model_dir, batch),
    }
    for key, check in problems.items():
        problem = check(settings[key]) if key in settings else ""
        if problem:
            said = f"{key}{problem}"
            if path.name == PBTXT_FILE:
                # Said in config.pbtxt's own names, which its author wrote.
                for ours, theirs in _PBTXT_NAMES.items():
                    said = said.replace(ours, theirs)
            raise RepositoryError(f"{_short(path)}: {said}")


def _read_pbtxt(model_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """Read a Triton config.pbtxt into settings (and notes on the fields not used).

    Raises:
        RepositoryError: it does not parse or cannot be served (the field named).
    """
    from appliance.formats.triton import (
        config_pbtxt as pbtxt,  # protobuf's text format: only where a model has one
    )

    try:
        return pbtxt.read(model_dir)
    except pbtxt.PbtxtError as ex:
        raise RepositoryError(f"{_short(model_dir / PBTXT_FILE)}: {ex}") from None


def _check_setting(key: str, value: object) -> str:
    """Return what is wrong with one setting, "" when nothing is."""
    if key not in SETTINGS:
        return f"unknown key; expected one of {', '.join(SETTINGS)}"
    minimum = _WHOLE_MINIMUM.get(key)
    if minimum is not None:
        good = _is_number(value, minimum, whole=True)
        return "" if good else f"expected an integer >= {minimum}, got {value!r}"
    if key in ("max_queue_delay_ms", "max_sequence_idle_s"):
        good = _is_number(value, 0, whole=False)
        return "" if good else f"expected a number >= 0, got {value!r}"
    check = _CHECKS.get(key)
    return check(value) if check is not None else ""


def _check_by(read: Callable[[Any], object], error: type[Exception] = ValueError) -> Any:
    """A check that reads the value with ``read``; what ``read`` raises is its message."""

    def check(value: object) -> str:
        try:
            read(value)
        except error as ex:
            return str(ex)
        return ""

    return check


def _check_choice(choices: tuple[str, ...] | dict[str, Any]) -> Any:
    def check(value: object) -> str:
        if value in choices:
            return ""
        return f"expected one of {', '.join(map(repr, choices))}, got {value!r}"

    return check


def _check_string(value: object) -> str:
    return "" if isinstance(value, str) else f"expected a string, got {value!r}"


def _check_file_name(value: object) -> str:
    if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
        return f"expected a file name in each version directory, got {value!r}"
    return ""


def _check_flag(value: object) -> str:
    return "" if isinstance(value, bool) else f"expected true or false, got {value!r}"


def _is_number(value: object, minimum: int, whole: bool) -> bool:
    kinds = int if whole else int | float
    return isinstance(value, kinds) and not isinstance(value, bool) and value >= minimum


def _check_tensors(value: object) -> str:
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        return "expected an array of tables ([[inputs]] / [[outputs]])"
    for index, item in enumerate(value):
        extra = set(item) - {"name", "dtype", "shape", "optional"}
        if extra:
            return (
                f"[{index}]: unknown key {sorted(extra)[0]!r}; expected name, dtype, shape "
                "(and optional, for an input)"
            )
        if not isinstance(item.get("optional", False), bool):
            return f"[{index}].optional: expected true or false, got {item['optional']!r}"
        if not isinstance(item.get("name"), str) or not item["name"]:
            return f"[{index}].name: expected a tensor name"
        if "dtype" in item and not isinstance(item["dtype"], str):
            return f"[{index}].dtype: expected a name such as FP32, got {item['dtype']!r}"
        shape = item.get("shape")
        if shape is not None and not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape)
        ):
            return f"[{index}].shape: expected a list of sizes (-1 = any), got {shape!r}"
    return ""


def _check_reshape(table: object) -> str:
    """What is wrong with a ``reshape`` table (worker/reshape.py): "" when nothing is."""
    if not isinstance(table, Mapping):
        return "expected a table of tensor names to {client, model} shapes"
    for name, shapes in table.items():
        if not isinstance(shapes, Mapping) or set(shapes) != {"client", "model"}:
            return f"[{name}]: expected client and model shapes"
        for kind in ("client", "model"):
            shape = shapes[kind]
            if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape
            ):
                return f"[{name}].{kind}: expected a list of sizes (-1 = any), got {shape!r}"
    return ""


def _check_steps(value: object) -> str:
    """Only the shape here; appliance/config/ensembles.py checks each step and the graph."""
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        return "expected an array of tables ([[steps]]: model, input_map, output_map)"
    return ""


def select_versions(model_dir: Path, policy: VersionPolicy) -> list[int]:
    """Return the versions the policy serves, oldest first.

    Raises:
        RepositoryError: there is no version, or a listed one is missing.
    """
    present = sorted(
        int(child.name) for child in model_dir.iterdir() if child.name.isdigit() and child.is_dir()
    )
    if not present:
        raise RepositoryError(
            f"{model_dir.name}/ has no version directory (such as {model_dir.name}/1/) "
            f"holding {' or '.join(MODEL_FILES)}"
        )
    if policy == "latest":
        return present[-1:]
    if policy == "all":
        return present
    missing = [v for v in policy if v not in present]
    if missing:
        raise RepositoryError(
            f"the version policy asks for version(s) {', '.join(map(str, missing))} of "
            f"{model_dir.name}, but it has {', '.join(map(str, present))}"
        )
    return [v for v in present if v in policy]


def _entry(
    name: str, version_dir: Path, version: int, settings: Mapping[str, Any]
) -> dict[str, Any]:
    path, cls = _model_file(version_dir, settings.get("platform"), settings.get("model_file"))
    try:
        stat = path.stat()
    except OSError as ex:
        raise RepositoryError(f"{_short(path)}: {ex.strerror}") from None
    options: dict[str, Any] = {
        key: value
        for key, value in settings.items()
        if key not in (*ENTRY_KEYS, "platform", "model_file")
    }
    stamp = ";".join([_stamp(stat), *_state_file_stamps(version_dir.parent, settings)])
    options.update(path=str(path), version=str(version), stamp=stamp)
    if cls == PYTHON_CLASS and "max_batch_size" in settings:
        # A Triton Python model's initialize reads it in args["model_config"].
        options["max_batch_size"] = settings["max_batch_size"]
    entry: dict[str, Any] = {"name": name, "class": cls, "options": options}
    entry.update({key: settings[key] for key in ENTRY_KEYS if key in settings})
    return entry


def _stamp(stat: os.stat_result) -> str:
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def _state_file_stamps(model_dir: Path, settings: Mapping[str, Any]) -> list[str]:
    """A stamp per initial-state data file, so that a reload sees one replaced in place.

    ``settings`` are checked (read_settings): a state's initial_file is a path
    inside the model directory, when given.
    """
    stamps = []
    for table in settings.get("sequence_state", ()):
        name = table.get("initial_file")
        if name is None:
            continue
        try:
            stamps.append(f"{name}={_stamp((model_dir / name).stat())}")
        except OSError:
            stamps.append(f"{name}=missing")  # its load says why; its arrival is a change
    return stamps


def _model_file(
    version_dir: Path, platform: str | None, filename: str | None = None
) -> tuple[Path, str]:
    if filename is not None:
        cls = PLATFORMS[platform][1] if platform is not None else MODEL_FILES.get(filename)
        if cls is None:
            raise RepositoryError(
                f"{_short(version_dir)}/{filename}: name the platform (or backend) of a model "
                f"file not called {' or '.join(MODEL_FILES)}"
            )
        if not (version_dir / filename).is_file():
            raise RepositoryError(f"{_short(version_dir)}/ has no {filename}")
        return version_dir / filename, cls
    if platform is not None:
        filename, cls = PLATFORMS[platform]
        if not (version_dir / filename).is_file():
            raise RepositoryError(f"{_short(version_dir)}/ has no {filename} (platform {platform})")
        return version_dir / filename, cls
    found = [name for name in MODEL_FILES if (version_dir / name).is_file()]
    if not found:
        others = ", ".join(sorted(child.name for child in version_dir.iterdir())[:5])
        raise RepositoryError(
            f"{_short(version_dir)}/ holds no {' or '.join(MODEL_FILES)} "
            f"(it holds: {others or 'nothing'})"
        )
    if len(found) > 1:
        raise RepositoryError(
            f"{_short(version_dir)}/ holds both {' and '.join(found)}; set platform in "
            f"{version_dir.parent.name}/{CONFIG_FILE}"
        )
    return version_dir / found[0], MODEL_FILES[found[0]]


def _short(path: Path) -> str:
    """Name a path from its model directory on: a status note holds 256 bytes."""
    parts = path.parts
    depth = {CONFIG_FILE: 2, PBTXT_FILE: 2, **dict.fromkeys(MODEL_FILES, 3)}.get(path.name, 2)
    return "/".join(parts[-depth:])


_WHOLE_MINIMUM = {
    "instances": 1,
    "threads": 1,
    "max_batch_size": 0,
    "max_queue": 1,
    "max_candidate_sequences": 1,
}
_CHECKS: dict[str, Any] = {
    "platform": _check_choice((*PLATFORMS, ENSEMBLE)),
    "versions": _check_by(parse_versions, RepositoryError),
    "device": devices.check,
    "description": _check_string,
    "model_file": _check_file_name,
    "sequence_batching": _check_flag,
    "response_cache": _check_flag,
    "reshape": _check_reshape,
    "sequence_strategy": _check_choice(("direct", "oldest")),
    "inputs": _check_tensors,
    "outputs": _check_tensors,
    "steps": _check_steps,
    "sequence_controls": _check_by(read_controls),
    "sequence_state": _check_by(read_states),
}
