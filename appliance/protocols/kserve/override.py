"""A load's override config: Triton's model-config JSON read into the appliance's keys.

Triton's ``load_model(name, config=...)`` sends the model config as JSON in
protobuf's JSON mapping, where int64 fields are strings (``"16"``). Only the
keys the appliance has a counterpart for are accepted; any other key is
refused by name, so an override never silently does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from appliance.errors import BadRequest

# Triton's keys -> the [[models]] key each one sets.
KNOWN = ("max_batch_size", "instance_group", "dynamic_batching", "name")
INSTANCE_KEYS = ("count", "kind", "name")
BATCHING_KEYS = ("max_queue_delay_microseconds",)


def parse(model: str, text: Any) -> dict[str, Any]:
    """Return the ``[[models]]`` keys (``max_batch_size``, ``instances``, ...) ``text`` sets.

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
    unknown = sorted(set(config) - set(KNOWN))
    if unknown:
        raise _refused(
            model,
            f"the override config sets {', '.join(unknown)}, which the appliance cannot apply; "
            f"it understands {', '.join(KNOWN)}",
        )
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
