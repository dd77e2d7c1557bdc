"""Types and the failure guard shared by the protocols' REST bindings.

The HTTP frontend is an asyncio (ASGI) app: one event loop per worker, so a
request waiting on a model holds no thread. A responder is either a
coroutine (inference, which waits through the model client's asyncio
channel) or plain blocking code, which :func:`blocking` runs on the worker's
thread pool (``http.threads``). Bodies are read in the loop before any
responder runs (bodies.py), so blocking code never reads the socket.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import falcon
import falcon.asgi

from appliance.protocols.threads import Threads

# The falcon app every protocol's REST routes mount into.
App = falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response]

Responder = Callable[..., Any]
AsyncResponder = Callable[..., Awaitable[None]]
# Renders any exception a responder raised in its protocol's error form.
RenderFailure = Callable[[falcon.Request, falcon.Response, Exception], None]


def blocking(responder: Responder) -> AsyncResponder:
    """Make a blocking responder a coroutine that runs it on the pool."""

    @functools.wraps(responder)
    async def wrapper(self: Any, req: falcon.Request, resp: falcon.Response, **params: Any) -> None:
        threads: Threads = req.context.threads
        context = contextvars.copy_context()
        # The access line names the model the thread called: the observer
        # (frontends/observe.py) reads it from the thread's context.
        req.context.call_context = context
        run = functools.partial(responder, self, req, resp, **params)
        await threads.call_in(context, run)

    return wrapper


def guarded(render: RenderFailure) -> Callable[[Responder], AsyncResponder]:
    """Decorate responders so that every failure is answered by ``render``.

    No exception leaves a responder: falcon would answer it with its own
    error body, which no protocol's client understands, and log a traceback
    per request. ``render`` logs the unexpected ones itself. A blocking
    responder runs on the pool (see :func:`blocking`).
    """

    def decorate(responder: Responder) -> AsyncResponder:
        run = responder if inspect.iscoroutinefunction(responder) else blocking(responder)

        @functools.wraps(responder)
        async def wrapper(
            self: Any, req: falcon.Request, resp: falcon.Response, **params: Any
        ) -> None:
            try:
                await run(self, req, resp, **params)
            except Exception as ex:
                render(req, resp, ex)

        return wrapper

    return decorate


def send_events(resp: Any, events: AsyncIterator[falcon.asgi.SSEvent]) -> None:
    """Answer with ``events`` as server-sent events (text/event-stream).

    falcon's ASGI response sends them as they come; it stops at the first event
    after the client has gone, and the generator is closed when dropped.
    """
    resp.sse = events
