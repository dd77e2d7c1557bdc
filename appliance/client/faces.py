"""A call's sync and async faces, made from its one core (call_cores.py).

Each core takes its client and the caller's channel; the decorators below
make the methods a caller calls (ModelClient's ``infer``, ``infer_async``,
``stream``, ...), which find the channel and drive the core (drive.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from appliance.client.call import Outbox
from appliance.client.drive import Client, Run, run, run_async
from appliance.client.result import InferResult

T = TypeVar("T")
P = ParamSpec("P")

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
