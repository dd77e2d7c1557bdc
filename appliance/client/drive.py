"""Run a call's steps in a thread or in an event loop: the only places a call waits.

Each call of the client API (api.py) is written once, as a generator of
steps: a float is a pause before trying a (re)starting model again, and a
:class:`~appliance.client.inflight.Call` asks for its next reply, which is
sent back in. :func:`run` blocks on a thread's :class:`Channel`;
:func:`run_async` awaits an event loop's :class:`AsyncChannel`. A wait's
error is thrown into the call at the step that waited, so the call gives
back what it holds and counts the error as if it had waited itself.

The decorators below make a method's sync and async faces from one core
that takes the channel after ``self``, so a call's signature and logic are
written once. PERF: a unary call costs a few generator steps beyond plain
function calls, under a microsecond against a round trip of ~50 us.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from appliance.client.aio import AsyncChannel
from appliance.client.channel import Channel
from appliance.client.inflight import Call, InferResult, Outbox
from appliance.core.descriptor import Message

T = TypeVar("T")
P = ParamSpec("P")
Step = float | Call
Steps = Generator[Step, Message | None, T]
Outcome = tuple[Message | None, BaseException | None]


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

    def open(self) -> Steps[None]: ...

    def next(self) -> Steps[InferResult | None]: ...

    def __enter__(self) -> Stream: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def run(channel: Channel, steps: Steps[T]) -> T:
    """Drive a call in this thread; return what it returns."""
    try:
        step = next(steps)
        while True:
            step = _resume(steps, *_wait(channel, step))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(channel: AsyncChannel, steps: Steps[T]) -> T:
    """:func:`run` in an event loop."""
    try:
        step = next(steps)
        while True:
            step = _resume(steps, *await _wait_async(channel, step))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def in_thread(
    core: Callable[Concatenate[C, Outbox, P], Steps[T]],
) -> Callable[Concatenate[C, P], T]:
    """The sync face of a unary call's core."""

    def face(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        channel = self._channel()
        return run(channel, core(self, channel, *args, **kwargs))

    face.__doc__ = core.__doc__
    return face


def in_loop(
    core: Callable[Concatenate[C, Outbox, P], Steps[T]],
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


def _resume(steps: Steps[Any], reply: Message | None, error: BaseException | None) -> Step:
    return steps.send(reply) if error is None else steps.throw(error)


def _wait(channel: Channel, step: Step) -> Outcome:
    try:
        if isinstance(step, float):
            time.sleep(step)
            return None, None
        return channel.wait(step.target, step.id, step.deadline), None
    except BaseException as ex:
        return None, ex


async def _wait_async(channel: AsyncChannel, step: Step) -> Outcome:
    try:
        if isinstance(step, float):
            await asyncio.sleep(step)
            return None, None
        return await channel.wait(step.target, step.id, step.deadline), None
    except BaseException as ex:
        return None, ex
