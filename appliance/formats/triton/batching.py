"""config.pbtxt's ``dynamic_batching``, read into the appliance's batching settings.

``max_queue_delay_microseconds`` as ``max_queue_delay_ms``, and the
priorities, queue policies and preferred batch sizes as the ``scheduling``
option (appliance/config/scheduling.py). A model with ``sequence_batching``
is batched by its sequences instead, read by sequences.py, which this
builds on.
"""

from __future__ import annotations

from typing import Any

from appliance._generated import triton_model_config_pb2 as mc
from appliance.formats.triton.sequences import SequenceFields


class BatchingFields(SequenceFields):
    """The dynamic_batching and sequence_batching part of a config.pbtxt reader (pbtxt._Reader)."""

    def _scheduling(self, batched: bool) -> dict[str, Any]:
        config = self.config
        settings: dict[str, Any] = {}
        if config.HasField("dynamic_batching"):
            batching = config.dynamic_batching
            if batching.max_queue_delay_microseconds:
                settings["max_queue_delay_ms"] = batching.max_queue_delay_microseconds / 1000
            scheduling = self._queue_scheduling(batching)
            if scheduling:
                settings["scheduling"] = scheduling
            if batching.preserve_ordering:
                self.notes.append(
                    "dynamic_batching.preserve_ordering is not used: each request's answer goes "
                    "to its own caller as soon as it is ready"
                )
        elif batched and not config.HasField("sequence_batching"):
            self.notes.append(
                "max_batch_size > 0 without dynamic_batching: requests are still batched "
                "together when they arrive while the model is busy"
            )
        if config.HasField("sequence_batching"):
            settings.update(self._sequences())
        return settings

    def _queue_scheduling(self, batching: Any) -> dict[str, Any]:
        """dynamic_batching's priorities, queue policies and preferred sizes as a
        ``scheduling`` table (appliance/config/scheduling.py); {} when none is set."""
        table: dict[str, Any] = {}
        if batching.priority_levels:
            table["priority_levels"] = int(batching.priority_levels)
        if batching.default_priority_level:
            table["default_priority_level"] = int(batching.default_priority_level)
        if batching.preferred_batch_size:
            table["preferred_batch_sizes"] = [int(n) for n in batching.preferred_batch_size]
        if batching.HasField("default_queue_policy"):
            table["default_queue_policy"] = _queue_policy(batching.default_queue_policy)
        if batching.priority_queue_policy:
            table["priority_queue_policy"] = {
                str(level): _queue_policy(policy)
                for level, policy in sorted(batching.priority_queue_policy.items())
            }
        return table


def _queue_policy(policy: Any) -> dict[str, Any]:
    action = mc.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action).lower()
    return {
        "timeout_action": action,
        "default_timeout_us": int(policy.default_timeout_microseconds),
        "allow_timeout_override": bool(policy.allow_timeout_override),
        "max_queue_size": int(policy.max_queue_size),
    }
