"""The asyncio event loop a frontend process runs: ``server.event_loop``.

"uvloop" (libuv's loop, the default) or "asyncio" (the standard library's).
The gRPC and MIP frontends run their server with :func:`run`; the HTTP
workers hand the same choice to uvicorn (``httpworker.py``). Measured side
by side in bench/bench_peers.py's event loop part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory for ``kind`` (None: asyncio's own)."""
    return uvloop.new_event_loop if kind == "uvloop" else None


def run(main: Coroutine[Any, Any, T], kind: str) -> T:
    """Run ``main`` to its end on a new loop of ``kind``, as ``asyncio.run`` does."""
    with asyncio.Runner(loop_factory=factory(kind)) as runner:
        return runner.run(main)
