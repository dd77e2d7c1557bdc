"""A model's queue scheduling: priority levels and queue policies (Triton's dynamic_batching).

The ``scheduling`` table of a model's options (config.pbtxt's
``dynamic_batching`` is read into it, or a config.toml gives it)::

    priority_levels = 2            # 1 is the highest; 0: no priorities
    default_priority_level = 2     # a request that names none
    preferred_batch_sizes = [4, 8] # with a queue delay: sent as soon as one fills
    [scheduling.default_queue_policy]
    timeout_action = "reject"      # or "delay"
    default_timeout_us = 0         # 0: a request waits as long as it takes
    allow_timeout_override = false # a request's own timeout may shorten its wait
    max_queue_size = 0             # per priority level; 0: the model's max_queue
    [scheduling.priority_queue_policy.1]
    ...                            # the same keys, for one level

Each model instance keeps its queue in priority order; a request whose wait
passes its timeout is refused (reject) or goes behind the requests of its
level that have not timed out (delay), as Triton's queue does.

Rule: plain data and checks; the repository scan and the model worker import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPTION = "scheduling"
REJECT, DELAY = "reject", "delay"
_POLICY_KEYS = ("timeout_action", "default_timeout_us", "allow_timeout_override", "max_queue_size")
_KEYS = (
    "priority_levels",
    "default_priority_level",
    "preferred_batch_sizes",
    "default_queue_policy",
    "priority_queue_policy",
)


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    timeout_action: str = REJECT
    default_timeout_s: float = 0.0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True, slots=True)
class Scheduling:
    priority_levels: int = 0
    default_priority_level: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    default_policy: QueuePolicy = QueuePolicy()
    policies: dict[int, QueuePolicy] = field(default_factory=dict)

    def policy(self, level: int) -> QueuePolicy:
        return self.policies.get(level, self.default_policy)

    def level(self, parameters: Mapping[str, Any], model: str) -> int:
        """The priority level a request's ``priority`` parameter asks for (0: none asked).

        Raises:
            ValueError: it is not a whole number, or not a level of this model.
        """
        asked = parameters.get("priority")
        if asked is None or asked == 0 or not self.priority_levels:
            # A model without levels runs every request alike, as Triton does.
            return self.default_priority_level
        if not isinstance(asked, int) or isinstance(asked, bool) or asked < 0:
            raise ValueError(f"parameter priority must be a whole number >= 0, got {asked!r}")
        if asked > self.priority_levels:
            raise ValueError(
                f"priority {asked} is not a level of model {model}: it has levels 1 (highest) "
                f"to {self.priority_levels} "
                "(dynamic_batching.priority_levels); 0 asks for the default"
            )
        return asked


def read(table: object, max_batch_size: int = -1) -> Scheduling:
    """A model's scheduling table, checked.

    Raises:
        ValueError: a key or value that is not one of the above (the key named).
    """
    if not isinstance(table, Mapping):
        raise ValueError(": expected a table")
    _known(table, _KEYS, "")
    levels = _whole(table, "priority_levels", 0)
    default = _whole(table, "default_priority_level", 0)
    if levels and not 1 <= default <= levels:
        raise ValueError(
            f".default_priority_level: {default} is not a level of 1 to {levels} (priority_levels)"
        )
    if default and not levels:
        raise ValueError(".default_priority_level: set, but priority_levels is 0")
    preferred = table.get("preferred_batch_sizes", [])
    if not isinstance(preferred, list) or not all(_is_whole(p) and p > 0 for p in preferred):
        raise ValueError(f".preferred_batch_sizes: expected sizes above 0, got {preferred!r}")
    too_big = [p for p in preferred if p > max_batch_size > 0]
    if too_big:
        raise ValueError(
            f".preferred_batch_sizes: {too_big[0]} exceeds max_batch_size {max_batch_size}"
        )
    policies = {}
    per_level = table.get("priority_queue_policy", {})
    if not isinstance(per_level, Mapping):
        raise ValueError(".priority_queue_policy: expected a table of levels")
    for key, raw in per_level.items():
        level = int(key) if str(key).isdigit() else -1
        if not 1 <= level <= levels:
            raise ValueError(
                f".priority_queue_policy: {key!r} is not a level of 1 to {levels} (priority_levels)"
            )
        policies[level] = _policy(raw, f".priority_queue_policy.{level}")
    default_policy = _policy(table.get("default_queue_policy", {}), ".default_queue_policy")
    return Scheduling(levels, default, tuple(sorted(preferred)), default_policy, policies)


def check(table: object, max_batch_size: int = -1) -> str:
    """What is wrong with a scheduling table ("" when nothing is)."""
    try:
        read(table, max_batch_size)
    except ValueError as ex:
        return str(ex)
    return ""


def _policy(raw: object, where: str) -> QueuePolicy:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a table")
    _known(raw, _POLICY_KEYS, where)
    action = raw.get("timeout_action", REJECT)
    if action not in (REJECT, DELAY):
        raise ValueError(f"{where}.timeout_action: expected 'reject' or 'delay', got {action!r}")
    override = raw.get("allow_timeout_override", False)
    if not isinstance(override, bool):
        raise ValueError(f"{where}.allow_timeout_override: expected true or false")
    timeout_us = _whole(raw, "default_timeout_us", 0, where)
    return QueuePolicy(action, timeout_us / 1e6, override, _whole(raw, "max_queue_size", 0, where))


def _known(table: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    extra = sorted(set(table) - set(keys))
    if extra:
        raise ValueError(f"{where}: unknown key {extra[0]!r}; expected {', '.join(keys)}")


def _whole(table: Mapping[str, Any], key: str, default: int, where: str = "") -> int:
    value = table.get(key, default)
    if not _is_whole(value) or value < 0:
        raise ValueError(f"{where}.{key}: expected a whole number >= 0, got {value!r}")
    return int(value)


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
