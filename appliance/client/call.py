"""One call in flight (:class:`Call`) and what it needs of its channel (:class:`Outbox`).

The table of calls (inflight.py) makes a Call when it sends a request and
settles it from its reply; the drivers (drive.py) wait on it and put the
reply, or the wait's error, on it. Apart from inflight.py since the
drivers, streams and ensembles hold calls and need nothing of the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from appliance.client.result import InferResult
from appliance.client.routing import Target
from appliance.core.descriptor import Message
from appliance.core.ring import Block


class Outbox(Protocol):
    """What a call needs of a channel besides waiting (both channel kinds have it)."""

    def send(self, target: Target, message: Message, flags: int = 0) -> None: ...

    def expect(self, request_id: int) -> None: ...

    def forget(self, request_id: int) -> None: ...

    def watch(self, request_id: int, target: Target) -> None: ...


@dataclass(slots=True, init=False)
class Call:
    """A request in flight: where it went, what it holds, and (a stream) how far it got.

    PERF: its ``__init__`` is written out, not generated: compiled
    (appliance/native.py), the dataclass one would still run as Python.
    """

    channel: Outbox
    target: Target
    id: int
    blocks: list[Block]
    deadline: float
    # What the last wait brought (see drive.py): a reply, or the wait's error.
    reply: Message | None
    error: BaseException | None
    previous: InferResult | None
    finished: bool
    # Run once the worker is done with the inputs of a call given up on (a
    # deadline, a failed wait): at once if it died, else when its late reply
    # comes. An ensemble keeps the blocks it sent by reference alive until then.
    after: Callable[[], None] | None

    def __init__(
        self, channel: Outbox, target: Target, id: int, blocks: list[Block], deadline: float
    ) -> None:
        self.channel = channel
        self.target = target
        self.id = id
        self.blocks = blocks
        self.deadline = deadline
        self.reply = None
        self.error = None
        self.previous = None
        self.finished = False
        self.after = None

    def take(self) -> Message:
        """The reply the last wait brought, or raise the wait's error."""
        reply, error = self.reply, self.error
        self.reply = self.error = None
        if error is not None:
            raise error
        assert reply is not None
        return reply
