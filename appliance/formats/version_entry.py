"""One served version of a model, as its ``[[models]]`` entry.

The version directory's model file picks the runtime (or the settings'
platform or model_file name it); the settings that are no key of the entry
become the runtime's options, with the file's path, the version and a stamp
(size and modification time, of the model file and of any initial-state
data file), so a reload sees a new version, or a file replaced in place, as
a changed model. Apart from the scan (repository.py), which finds the
versions, and from a model directory's settings (model_settings.py), which
this only reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.formats.repository_layout import (
    CONFIG_FILE,
    MODEL_FILES,
    PLATFORMS,
    PYTHON_CLASS,
    RepositoryError,
    short_path,
)

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


def version_entry(
    name: str, version_dir: Path, version: int, settings: Mapping[str, Any]
) -> dict[str, Any]:
    """The entry serving ``version_dir`` as ``name``, from its model directory's settings.

    Raises:
        RepositoryError: the version directory holds no model file to serve, or several.
    """
    path, cls = _model_file(version_dir, settings.get("platform"), settings.get("model_file"))
    try:
        stat = path.stat()
    except OSError as ex:
        raise RepositoryError(f"{short_path(path)}: {ex.strerror}") from None
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
                f"{short_path(version_dir)}/{filename}: name the platform (or backend) of a model "
                f"file not called {' or '.join(MODEL_FILES)}"
            )
        if not (version_dir / filename).is_file():
            raise RepositoryError(f"{short_path(version_dir)}/ has no {filename}")
        return version_dir / filename, cls
    if platform is not None:
        filename, cls = PLATFORMS[platform]
        if not (version_dir / filename).is_file():
            raise RepositoryError(
                f"{short_path(version_dir)}/ has no {filename} (platform {platform})"
            )
        return version_dir / filename, cls
    found = [name for name in MODEL_FILES if (version_dir / name).is_file()]
    if not found:
        others = ", ".join(sorted(child.name for child in version_dir.iterdir())[:5])
        raise RepositoryError(
            f"{short_path(version_dir)}/ holds no {' or '.join(MODEL_FILES)} "
            f"(it holds: {others or 'nothing'})"
        )
    if len(found) > 1:
        raise RepositoryError(
            f"{short_path(version_dir)}/ holds both {' and '.join(found)}; set platform in "
            f"{version_dir.parent.name}/{CONFIG_FILE}"
        )
    return version_dir / found[0], MODEL_FILES[found[0]]
