"""Blocking work for an event-loop frontend, on a bounded pool of threads.

The frontend process makes the pool and hands it to its protocols' routes.

The gRPC and HTTP frontends answer inference, streamed or not, in their
event loops (the model client's asyncio channel, no thread hop). Some calls
block: loading a model waits for its worker, metadata may ask a worker.
Those run here, so the loop never stalls. Each job runs in a copy of the
caller's context, so the per-request protocol label
(``appliance.observability.metrics``) follows it into the thread.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Threads:
    """A pool of ``size`` threads for blocking calls."""

    def __init__(self, size: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix=name)

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` in a thread; return (or raise) what it does."""
        return await self.call_in(contextvars.copy_context(), function, *args)

    async def call_in(
        self, context: contextvars.Context, function: Callable[..., T], *args: Any
    ) -> T:
        """:meth:`call` in ``context``, where the caller can read what it set."""
        future = self._pool.submit(context.run, function, *args)
        return await asyncio.wrap_future(future)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
