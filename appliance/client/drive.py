"""Run a call's steps in a thread or in an event loop: the only places a call waits.

Each call of the client API (call_cores.py) is written once, as a generator: it
yields a float to pause before trying a (re)starting model again, a
:class:`~appliance.client.call.Call` to wait for that call's next reply,
and last its result. :func:`run` blocks on a thread's :class:`Channel`;
:func:`run_async` awaits an event loop's :class:`AsyncChannel`. The reply,
or the wait's error, is put on the Call, so the call gives back what it
holds and counts the error as if it had waited itself.

faces.py makes a method's sync and async faces from one core that takes
the channel after ``self``, so a call's signature and logic are written
once. The drivers are compiled with the request path (appliance/native.py);
the faces are not: a compiled function kept on a class does not bind.

PERF: the drivers iterate (``for``) rather than ``send``: a generator that
ends inside a for loop costs no StopIteration, which costs more than the
rest of the machinery together (~2 us a call against ~0.5 us, measured on
this machine kind). The wait's outcome travels on the Call for that reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator, Mapping
from typing import Any, Protocol, TypeVar

from appliance.client.aio import AsyncChannel
from appliance.client.call import Call
from appliance.client.channel import Channel
from appliance.client.routing import Target

T = TypeVar("T")
Step = float | Call
# Part of a call: its pauses and waits, then (returned) its value.
Steps = Generator[Step, None, T]
# A whole call: its pauses and waits, then (yielded last) its result.
Run = Generator[Step | T, None, None]


class Pick(Protocol):
    """How a call's instance is chosen: the client's one place that picks (ModelClient._pick)."""

    def __call__(
        self, model: str, timeout_s: float | None, parameters: Mapping[str, Any] | None
    ) -> Steps[tuple[Target, float]]: ...


class Client(Protocol):
    """What the faces need of their owner: the caller's channel, made on first use."""

    def _channel(self) -> Channel: ...

    def _async_channel(self) -> AsyncChannel: ...


def run(channel: Channel, steps: Run[T]) -> T:
    """Drive a call in this thread; return its result."""
    try:
        for step in steps:
            if isinstance(step, Call):
                try:
                    step.reply = channel.wait(step.target, step.id, step.deadline)
                except BaseException as ex:
                    step.error = ex
            elif isinstance(step, float):
                time.sleep(step)
            else:
                result = step
    except BaseException:
        steps.close()  # at once, when a pause failed: a waiting count goes down
        raise
    return result


async def run_async(channel: AsyncChannel, steps: Run[T]) -> T:
    """:func:`run` in an event loop."""
    try:
        for step in steps:
            if isinstance(step, Call):
                try:
                    step.reply = await channel.wait(step.target, step.id, step.deadline)
                except BaseException as ex:
                    step.error = ex
            elif isinstance(step, float):
                await asyncio.sleep(step)
            else:
                result = step
    except BaseException:
        steps.close()
        raise
    return result
