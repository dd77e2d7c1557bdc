"""The box an event loop's request waits on: the messages not taken yet, and its waiter.

Apart from aio.py, which is compiled with the request path
(appliance/native.py): mypyc does not compile a subclass of deque.
"""

from __future__ import annotations

import asyncio
from collections import deque

from appliance.core.descriptor import Message
from appliance.errors import ApplianceError

Item = Message | ApplianceError


class ReplyBox(deque[Item]):
    """The messages of one request not yet taken, and the future its waiter awaits."""

    __slots__ = ("waiter",)

    def __init__(self) -> None:
        super().__init__()
        self.waiter: asyncio.Future[Item] | None = None

    def append(self, item: Item) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            self.waiter = None
            waiter.set_result(item)
        else:
            super().append(item)
