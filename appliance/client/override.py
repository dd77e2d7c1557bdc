"""A load's override config: Triton's model-config JSON read into the appliance's keys.

Triton's ``load_model(name, config=...)`` sends the model config as JSON in
protobuf's JSON mapping, where int64 fields are strings (``"16"``). Only the
keys the appliance has a counterpart for are accepted; any other key is
refused by name, so an override never silently does nothing. A load that
ships the model's files may also name its ``platform`` or ``backend``, which
must agree with the model file shipped.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import orjson

from appliance.errors import BadRequest
from appliance.formats.repository_layout import PLATFORMS

# Triton's keys -> the [[models]] key each one sets.
KNOWN = ("max_batch_size", "instance_group", "dynamic_batching", "name")
# With files: what the model is, which must match the model file shipped.
WITH_FILES = ("platform", "backend")
# Triton's backend names -> the model file each one loads.
BACKENDS = {"onnxruntime": "model.onnx", "pytorch": "model.pt"}
INSTANCE_KEYS = ("count", "kind", "name")
BATCHING_KEYS = ("max_queue_delay_microseconds",)


def parse(model: str, text: Any, files: Collection[str] | None = None) -> dict[str, Any]:
    """Return the ``[[models]]`` keys (``max_batch_size``, ``instances``, ...) ``text`` sets.

    ``files``: the paths of the model files the load ships, if any; then
    ``platform`` and ``backend`` are accepted when they name that model file.

    Raises:
        BadRequest: ``text`` is not a JSON object, or holds a key or value the
            appliance cannot apply.
    """
    try:
        config = orjson.loads(text) if isinstance(text, str | bytes) else text
    except orjson.JSONDecodeError as ex:
        raise _refused(model, f"the override config is not valid JSON ({ex})") from None
    if not isinstance(config, dict):
        raise _refused(model, "the override config must be a JSON object")
    known = (*KNOWN, *WITH_FILES) if files else KNOWN
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise _refused(
            model,
            f"the override config sets {', '.join(unknown)}, which the appliance cannot apply; "
            f"it understands {', '.join(known)}",
        )
    if files:
        _check_kind(model, config, files)
    if "name" in config and config["name"] != model:
        raise _refused(model, f"the override config names model {config['name']!r}")
    overrides: dict[str, Any] = {}
    if "max_batch_size" in config:
        overrides["max_batch_size"] = _integer(model, "max_batch_size", config["max_batch_size"])
    if "instance_group" in config:
        overrides["instances"] = _instances(model, config["instance_group"])
    if "dynamic_batching" in config:
        overrides["max_queue_delay_ms"] = _delay_ms(model, config["dynamic_batching"])
    return overrides


def _check_kind(model: str, config: Mapping[str, Any], files: Collection[str]) -> None:
    """Refuse a ``platform`` or ``backend`` that names no model file shipped."""
    shipped = {path.split("/")[-1] for path in files if path.count("/") == 1}
    platforms = {name: filename for name, (filename, _cls) in PLATFORMS.items()}
    for key, kinds in (("platform", platforms), ("backend", BACKENDS)):
        if key not in config:
            continue
        wanted = kinds.get(config[key]) if isinstance(config[key], str) else None
        if wanted is None:
            raise _refused(
                model,
                f"{key} {config[key]!r} is not one the appliance serves; "
                f"it serves {', '.join(kinds)}",
            )
        if wanted not in shipped:
            raise _refused(
                model,
                f"{key} {config[key]!r} loads <version>/{wanted}, which the files do not "
                f"hold (they hold {', '.join(sorted(files))[:200]})",
            )


def _instances(model: str, groups: Any) -> int:
    if not isinstance(groups, list) or not groups:
        raise _refused(model, "instance_group must be a list of groups")
    count = 0
    for group in groups:
        if not isinstance(group, Mapping) or set(group) - set(INSTANCE_KEYS):
            raise _refused(model, f"each instance_group may set only {', '.join(INSTANCE_KEYS)}")
        if group.get("kind", "KIND_CPU") not in ("KIND_CPU", "KIND_AUTO"):
            raise _refused(
                model, "instance_group kind must be KIND_CPU (the appliance is CPU-only)"
            )
        count += _integer(model, "instance_group count", group.get("count", 1), least=1)
    return count


def _delay_ms(model: str, batching: Any) -> float:
    if not isinstance(batching, Mapping) or set(batching) - set(BATCHING_KEYS):
        raise _refused(model, f"dynamic_batching may set only {', '.join(BATCHING_KEYS)}")
    micros = _integer(model, "max_queue_delay_microseconds", batching.get(BATCHING_KEYS[0], 0))
    return micros / 1000.0


def _integer(model: str, key: str, value: Any, least: int = 0) -> int:
    """An int64 field: a JSON number or, as protobuf's JSON writes it, a string."""
    if isinstance(value, bool):
        raise _refused(model, f"{key} must be an integer, not {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _refused(model, f"{key} must be an integer, not {value!r}") from None
    if number < least or (isinstance(value, float) and not value.is_integer()):
        raise _refused(model, f"{key} must be an integer of at least {least}, not {value!r}")
    return number


def _refused(model: str, why: str) -> BadRequest:
    return BadRequest(f"failed to load '{model}': {why}")
