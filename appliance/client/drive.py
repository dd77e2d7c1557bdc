"""Run a call's steps in a thread or in an event loop: the only places a call waits.

Each call of the client API (api.py) is written once, as a generator of
steps: a float is a pause before trying a (re)starting model again, a
:class:`~appliance.client.inflight.Call` asks for its next reply, and an
:class:`~appliance.client.inflight.InferResult` is a stream's part for the
consumer. The sync drivers block on a thread's :class:`Channel`; the async
ones await an event loop's :class:`AsyncChannel`. A wait's error is thrown
into the call at the step that waited, so the call gives back what it holds
and counts the error as if it had waited itself.

PERF: a unary call takes one generator and one ``send`` beyond a plain
function call, well under a microsecond against a round trip of ~50 us.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Generator, Iterator
from typing import TypeVar

from appliance.client.aio import AsyncChannel
from appliance.client.channel import Channel
from appliance.client.inflight import Call, InferResult
from appliance.core.descriptor import Message

T = TypeVar("T")
Step = float | Call
Steps = Generator[Step, Message | None, T]
Parts = Generator[Step | InferResult, Message | None, None]


def run(channel: Channel, steps: Steps[T]) -> T:
    """Drive a unary call in this thread; return what it returns."""
    try:
        step = next(steps)
        while True:
            try:
                reply = _wait(channel, step)
            except BaseException as ex:
                step = steps.throw(ex)
            else:
                step = steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def run_stream(channel: Channel, steps: Parts) -> Iterator[InferResult]:
    """Drive a stream in this thread, yielding its parts; closing it closes the stream."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, InferResult):
                yield step
                step = next(steps)
                continue
            try:
                reply = _wait(channel, step)
            except BaseException as ex:
                step = steps.throw(ex)
            else:
                step = steps.send(reply)
    except StopIteration:
        return
    finally:
        steps.close()


async def run_async(channel: AsyncChannel, steps: Steps[T]) -> T:
    """:func:`run` in an event loop."""
    try:
        step = next(steps)
        while True:
            try:
                reply = await _wait_async(channel, step)
            except BaseException as ex:
                step = steps.throw(ex)
            else:
                step = steps.send(reply)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_stream_async(
    channel: AsyncChannel, steps: Parts
) -> AsyncGenerator[InferResult, None]:
    """:func:`run_stream` in an event loop; ``aclose`` closes the stream."""
    try:
        step = next(steps)
        while True:
            if isinstance(step, InferResult):
                yield step
                step = next(steps)
                continue
            try:
                reply = await _wait_async(channel, step)
            except BaseException as ex:
                step = steps.throw(ex)
            else:
                step = steps.send(reply)
    except StopIteration:
        return
    finally:
        steps.close()


def _wait(channel: Channel, step: Step) -> Message | None:
    if isinstance(step, float):
        time.sleep(step)
        return None
    return channel.wait(step.target, step.id, step.deadline)


async def _wait_async(channel: AsyncChannel, step: Step) -> Message | None:
    if isinstance(step, float):
        await asyncio.sleep(step)
        return None
    return await channel.wait(step.target, step.id, step.deadline)
