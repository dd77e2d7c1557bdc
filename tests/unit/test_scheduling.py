"""Priorities, queue policies and preferred batch sizes: the checks and the queue's order."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.config import scheduling
from appliance.core.descriptor import Kind, Message
from appliance.worker.batcher import ANY_REQUEST, Batcher
from appliance.worker.pending import Pending


def pending(tag: int, rank: int = 0, rows: int = 1, arrived: float = 0.0) -> Pending:
    message = Message(Kind.INFER, tag, 1)
    item = Pending(message, {}, "predict", {}, None, rows, ANY_REQUEST, arrived=arrived)
    item.rank = rank
    return item


def tags(batcher: Batcher) -> list[int]:
    return [item.request_id for item in batcher.queue]


def test_a_queue_keeps_priority_order_and_arrival_order_within_a_level() -> None:
    batcher = Batcher(1, 0.0)
    for tag, rank in [(1, 4), (2, 2), (3, 4), (4, 2), (5, 6)]:
        batcher.add(pending(tag, rank))
    assert tags(batcher) == [2, 4, 1, 3, 5]


def test_a_request_past_its_timeout_is_refused_or_goes_behind_its_level() -> None:
    batcher = Batcher(1, 0.0)
    late, timely, refused = pending(1, 2), pending(2, 2), pending(3, 2)
    late.expires, late.delay = 1.0, True
    refused.expires = 1.0
    lower = pending(4, 4)
    for item in (late, timely, refused, lower):
        batcher.add(item)
    assert batcher.expire(0.5) == []
    assert batcher.expire(2.0) == [refused]
    # Behind the requests of its level still in time, ahead of lower levels.
    assert tags(batcher) == [2, 1, 4]


def test_a_preferred_batch_size_is_sent_as_soon_as_the_queue_fills_it() -> None:
    batcher = Batcher(8, max_queue_delay_s=10.0, preferred=(2, 4))
    batcher.add(pending(1))
    assert batcher.take(0.0) == []
    for tag in (2, 3):
        batcher.add(pending(tag))
    # Three rows queued: a batch of the largest preferred size they fill, at once.
    assert [item.request_id for item in batcher.take(0.0)] == [1, 2]
    assert tags(batcher) == [3]
    # Once the delay is over, whatever is there goes.
    assert [item.request_id for item in batcher.take(20.0)] == [3]


def table(**policy: Any) -> dict[str, Any]:
    return {"priority_levels": 2, "default_priority_level": 2, "default_queue_policy": policy}


def test_a_request_s_priority_picks_its_level() -> None:
    read = scheduling.read(table(timeout_action="delay", default_timeout_us=1500))
    assert read.default_policy == scheduling.QueuePolicy("delay", 0.0015, False, 0)
    assert [read.level({"priority": p}, "m") for p in (None, 0, 1, 2)] == [2, 2, 1, 2]
    with pytest.raises(ValueError, match=r"priority 3 is not a level of model m: .* to 2"):
        read.level({"priority": 3}, "m")
    with pytest.raises(ValueError, match="whole number"):
        read.level({"priority": "high"}, "m")
    # A model without levels runs every request alike, whatever it asks for.
    assert scheduling.read({}).level({"priority": 9}, "m") == 0


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (table(timeout_action="drop"), ".default_queue_policy.timeout_action: expected 'reject'"),
        (
            table(default_timeout_us=-1),
            ".default_queue_policy.default_timeout_us: expected a whole",
        ),
        (table(max_queue_size="ten"), ".default_queue_policy.max_queue_size: expected a whole"),
        (table(nope=1), ".default_queue_policy: unknown key 'nope'"),
        ({"priority_levels": 2, "default_priority_level": 3}, ".default_priority_level: 3 is not"),
        ({"default_priority_level": 1}, "set, but priority_levels is 0"),
        ({"preferred_batch_sizes": [4, 16]}, ".preferred_batch_sizes: 16 exceeds max_batch_size 8"),
        (
            {"priority_levels": 1, "default_priority_level": 1, "priority_queue_policy": {"2": {}}},
            "'2' is not a level of 1 to 1",
        ),
    ],
)
def test_a_scheduling_table_that_cannot_be_served_is_refused_naming_the_key(
    bad: dict[str, Any], words: str
) -> None:
    assert words in scheduling.check(bad, max_batch_size=8)
