"""Run a call's steps in a thread or in an event loop: the only places a call waits.

Each call of the client API (call_cores.py) is written once, as a generator: it
yields a float to pause before trying a (re)starting model again, a
:class:`~appliance.client.call.Call` to wait for that call's next reply,
and last its result. :func:`run` blocks on a thread's :class:`Channel`;
:func:`run_async` awaits an event loop's :class:`AsyncChannel`. The reply,
or the wait's error, is put on the Call, so the call gives back what it
holds and counts the error as if it had waited itself.

The decorators below make a method's sync and async faces from one core
that takes the channel after ``self``, so a call's signature and logic are
written once.

PERF: the drivers iterate (``for``) rather than ``send``: a generator that
ends inside a for loop costs no StopIteration, which costs more than the
rest of the machinery together (~2 us a call against ~0.5 us, measured on
this machine kind). The wait's outcome travels on the Call for that reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterator, Mapping
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from appliance.client.aio import AsyncChannel
from appliance.client.call import Call, Outbox
from appliance.client.channel import Channel
from appliance.client.result import InferResult
from appliance.client.routing import Target

T = TypeVar("T")
P = ParamSpec("P")
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


C = TypeVar("C", bound=Client)


class Stream(Protocol):
    """A stream's core: open it, take each part (None at its end), then leave it.

    Leaving (``__exit__``) ends the stream, cancelling it in the worker when
    the consumer stopped early.
    """

    def open(self) -> Run[None]: ...

    def next(self) -> Run[InferResult | None]: ...

    def __enter__(self) -> Stream: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


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


def in_thread(
    core: Callable[Concatenate[C, Outbox, P], Run[T]],
) -> Callable[Concatenate[C, P], T]:
    """The sync face of a unary call's core."""

    def face(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        channel = self._channel()
        return run(channel, core(self, channel, *args, **kwargs))

    face.__doc__ = core.__doc__
    return face


def in_loop(
    core: Callable[Concatenate[C, Outbox, P], Run[T]],
) -> Callable[Concatenate[C, P], Coroutine[Any, Any, T]]:
    """The async face of a unary call's core (no thread hop)."""

    async def face(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        channel = self._async_channel()
        return await run_async(channel, core(self, channel, *args, **kwargs))

    face.__doc__ = core.__doc__
    return face


def stream_in_thread(
    core: Callable[Concatenate[C, Outbox, P], Stream],
) -> Callable[Concatenate[C, P], Iterator[InferResult]]:
    """The sync face of a stream's core: a generator of its parts.

    Each part is released when the next one is requested; closing the
    generator early cancels the stream in the worker.
    """

    def face(self: C, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[InferResult]:
        # Here, not at the call: the thread that iterates owns the channel.
        channel = self._channel()
        with core(self, channel, *args, **kwargs) as stream:
            run(channel, stream.open())
            while (part := run(channel, stream.next())) is not None:
                yield part

    face.__doc__ = core.__doc__
    return face


def stream_in_loop(
    core: Callable[Concatenate[C, Outbox, P], Stream],
) -> Callable[Concatenate[C, P], AsyncGenerator[InferResult, None]]:
    """The async face of a stream's core; ``aclose`` cancels the stream."""

    async def face(self: C, /, *args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[InferResult]:
        channel = self._async_channel()
        with core(self, channel, *args, **kwargs) as stream:
            await run_async(channel, stream.open())
            while (part := await run_async(channel, stream.next())) is not None:
                yield part

    face.__doc__ = core.__doc__
    return face
