"""Blocking work for an event-loop frontend, on a bounded pool of threads.

The gRPC and HTTP frontends answer inference in their event loops (the
model client's asyncio channel, no thread hop). Some calls block: loading a model waits
for its worker, and a streaming model's parts come from a blocking
generator. Those run here, so the loop never stalls.

A whole stream runs in one thread: the model client gives each thread its
own ZeroMQ sockets, and those must never be used from two threads. Each
job runs in a copy of the caller's context, so the per-request protocol
label (``appliance.metrics``) follows it into the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()


class Threads:
    """A pool of ``size`` threads for blocking calls and streams."""

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

    async def iterate(self, make: Callable[[], Iterator[T]]) -> AsyncGenerator[T, None]:
        """Yield the items of the iterator ``make()`` returns, run in one thread.

        The thread stays at most one item ahead. When the consumer stops
        early (the client cancelled, or an error), the iterator is closed
        in its own thread after its current item: closing a model stream
        cancels it in the worker.
        """
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()
        taken = threading.Semaphore(0)
        stop = threading.Event()

        def put(more: bool, value: Any) -> None:
            # The loop may be gone when a stream outlives a stopping server.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(items.put_nowait, (more, value))

        def produce() -> None:
            try:
                iterator = make()
                try:
                    for item in iterator:
                        put(True, item)
                        taken.acquire()
                        if stop.is_set():
                            return
                finally:
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()
                put(False, _END)
            except BaseException as ex:  # handed to the consumer, raised there
                put(False, ex)

        context = contextvars.copy_context()
        self._pool.submit(context.run, produce)
        try:
            while True:
                more, value = await items.get()
                if not more:
                    if value is not _END:
                        raise value
                    return
                yield value
                taken.release()
        finally:
            stop.set()
            taken.release()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
