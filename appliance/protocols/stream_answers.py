"""The requests of one bidirectional stream answered side by side, as Triton answers them.

A client may send many requests on one stream (tritonclient's
``async_stream_infer``, perf_analyzer's ``--streaming``) and match the
answers by request id. Answered one after the other, a stream would run at
one request per round trip, whatever the instances behind it. Here each
request is answered by a task of its own as soon as it is read, and the
answers go out in the order they are ready, with two limits:

- requests of one sequence (one ``order_key``) are answered in the order they
  came: a step starts when the one before it is done, as a sequence model
  needs them;
- at most ``in_flight`` requests of a stream are answered at once; the next is
  read from the stream when one is done, so a client that sends faster than
  the models answer is held back by the stream's own flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

IN_FLIGHT = 64
_END = object()


async def answer_side_by_side(
    requests: AsyncIterator[Any],
    answer: Callable[[Any], AsyncIterator[Any]],
    order_key: Callable[[Any], Hashable | None],
    in_flight: int = IN_FLIGHT,
) -> AsyncIterator[Any]:
    """Each of ``answer(request)``'s items, for every request of ``requests``.

    ``answer`` turns its own failures into items (error responses); an
    exception that escapes it, or the request stream's, ends the stream with it.
    """
    ready: asyncio.Queue[Any] = asyncio.Queue(maxsize=in_flight)
    slots = asyncio.Semaphore(in_flight)
    running: set[asyncio.Task[None]] = set()
    last_of: dict[Hashable, asyncio.Task[None]] = {}

    async def one(request: Any, before: asyncio.Task[None] | None) -> None:
        try:
            if before is not None:
                # The step before it in its sequence: done, whichever way it ended.
                await asyncio.wait([before])
            async for item in answer(request):
                await ready.put(item)
        finally:
            slots.release()

    async def read() -> None:
        async for request in requests:
            await slots.acquire()
            key = order_key(request)
            task = asyncio.ensure_future(one(request, last_of.get(key) if key else None))
            running.add(task)
            task.add_done_callback(running.discard)
            if key:
                last_of[key] = task
                task.add_done_callback(functools.partial(_forget, last_of, key))
        if running:
            await asyncio.gather(*running)

    reader = asyncio.ensure_future(read())
    reader.add_done_callback(functools.partial(_wake, ready))
    try:
        while True:
            if reader.done() and ready.empty():
                break
            item = await ready.get()
            if item is _END:
                break
            yield item
        reader.result()  # the requests' or an answer's exception, if one ended it
    finally:
        for task in (reader, *running):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(reader, *running, return_exceptions=True)


def _forget(last_of: dict[Hashable, asyncio.Task[None]], key: Hashable, done: Any) -> None:
    if last_of.get(key) is done:
        del last_of[key]


def _wake(ready: asyncio.Queue[Any], _reader: Any) -> None:
    """The reader is done: end the wait for the next item (a full queue is drained first)."""
    if not ready.full():
        ready.put_nowait(_END)
