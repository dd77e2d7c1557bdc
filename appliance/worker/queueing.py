"""Priorities and queue policies of one instance's queue (appliance/config/scheduling.py).

A request's ``priority`` parameter is taken out of its parameters (a model
never sees it, as in Triton); where the model has priority levels it picks
the request's level, its rank in the queue and its queue policy: how many
requests of that level may wait, and how long one may wait before it is
refused or delayed.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from appliance.config.scheduling import DELAY, Scheduling
from appliance.errors import BadRequest, Rejected
from appliance.worker.batcher import Batcher
from appliance.worker.pending import Pending

PRIORITY = "priority"


def take_priority(body: MutableMapping[str, Any]) -> Any:
    """Remove and return the request's priority parameter (None: none given)."""
    parameters = body.get("params")
    if isinstance(parameters, dict) and PRIORITY in parameters:
        return parameters.pop(PRIORITY)
    return None


class Queueing:
    def __init__(self, scheduling: Scheduling, model: str) -> None:
        self.scheduling = scheduling
        self.model = model
        policies = [scheduling.default_policy, *scheduling.policies.values()]
        # Whether any request can run out of time in the queue.
        self.timed = any(p.default_timeout_s or p.allow_timeout_override for p in policies)

    def level(self, priority: Any) -> int:
        """The level a request's priority asks for.

        Raises:
            BadRequest: not a whole number, or not one of the model's levels.
        """
        try:
            return self.scheduling.level({PRIORITY: priority}, self.model)
        except ValueError as ex:
            raise BadRequest(str(ex)) from None

    def place(self, pending: Pending, level: int, batcher: Batcher) -> None:
        """Set the request's rank and time in the queue, before it joins ``batcher``.

        Raises:
            Rejected: its level already holds its policy's max_queue_size requests.
        """
        policy = self.scheduling.policy(level)
        if policy.max_queue_size:
            rank = 2 * level
            queued = sum(1 for item in batcher.queue if item.rank in (rank, rank + 1))
            if queued >= policy.max_queue_size:
                where = f"priority level {level}" if level else "the queue"
                raise Rejected(
                    f"model {self.model}: Exceeds maximum queue size: {where} already holds "
                    f"{queued} requests (max_queue_size {policy.max_queue_size}); retry later"
                )
        pending.rank = 2 * level
        pending.delay = policy.timeout_action == DELAY
        expires = pending.arrived + policy.default_timeout_s if policy.default_timeout_s else 0.0
        deadline = pending.message.deadline
        if policy.allow_timeout_override and deadline:
            # As in Triton, a request may shorten its wait, never lengthen it.
            expires = min(expires, deadline) if expires else deadline
        pending.expires = expires

    def timed_out(self, pending: Pending, now: float) -> Rejected:
        waited_ms = (now - pending.arrived) * 1000
        return Rejected(
            f"model {self.model}: Request timeout expired after {waited_ms:.0f} ms in the queue "
            "(dynamic_batching queue policy: timeout_action REJECT)"
        )
