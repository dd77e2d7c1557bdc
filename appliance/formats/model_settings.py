"""A model directory's settings: its config.toml or config.pbtxt, read and checked.

:func:`read_settings` reads the one a model directory holds (Triton's
config.pbtxt through formats/triton/config_pbtxt.py) into one mapping of
settings, checks each value against what config.toml may hold, and checks
the tables whose checks need the model's max_batch_size. Apart from the
scan (repository.py), which only decides what to do with the settings: a
model's entries, an ensemble's, or a Broken one with the reason this module
gives.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from appliance.config import device as devices
from appliance.config import scheduling, warmup
from appliance.core.sequences import read_controls, read_states
from appliance.formats.model_versions import parse_versions
from appliance.formats.repository_layout import (
    CONFIG_FILE,
    ENSEMBLE,
    NOTES,
    PBTXT_FILE,
    PLATFORMS,
    RepositoryError,
    short_path,
)

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
# What an ensemble's config.toml may hold (the rest configure a worker).
ENSEMBLE_SETTINGS = ("platform", "steps", "inputs", "outputs", "max_batch_size", "description")


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
        raise RepositoryError(f"{short_path(path)}: cannot read it: {ex}") from None
    for key, value in settings.items():
        problem = _check_setting(key, value)
        if problem:
            raise RepositoryError(f"{short_path(path)}: {key}: {problem}")
    implicit = "sequence_controls" in settings or "sequence_state" in settings
    # The worker fills these inputs per step of a sequence: nothing else can.
    if implicit and settings.setdefault("sequence_batching", True) is not True:
        raise RepositoryError(
            f"{short_path(path)}: sequence_batching: false, but sequence_controls or "
            "sequence_state declare inputs only a sequence's steps fill"
        )
    _check_with_batch_size(settings, model_dir, path)
    if notes:
        settings[NOTES] = [f"{short_path(path)}: {note}" for note in notes]
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
            f"{short_path(path)}: scheduling: a sequence model's queue follows its sequences; "
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
            raise RepositoryError(f"{short_path(path)}: {said}")


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
        raise RepositoryError(f"{short_path(model_dir / PBTXT_FILE)}: {ex}") from None


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
