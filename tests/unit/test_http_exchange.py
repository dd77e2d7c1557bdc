"""What a client gets when the HTTP app fails while it answers (frontends/http_exchange.py).

The appliance's own connection (frontends/http11.py) on a loopback socket,
serving small ASGI apps that go wrong at each step of an answer; the client
is a plain socket that reads until the server closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from appliance.frontends.http11 import Connection

Send = Callable[[dict[str, Any]], Awaitable[None]]
HELD = [(b"content-type", b"text/plain"), (b"content-length", b"5")]


async def fails_after_start(scope: dict[str, Any], receive: Any, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": HELD})
    raise RuntimeError("the app broke after its start")


async def returns_after_start(scope: dict[str, Any], receive: Any, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": HELD})


async def sends_a_bad_header(scope: dict[str, Any], receive: Any, send: Send) -> None:
    headers = [*HELD, (b"x-note", b"two\r\nlines")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})


async def fails_mid_body(scope: dict[str, Any], receive: Any, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": HELD})
    await send({"type": "http.response.body", "body": b"ab", "more_body": True})
    raise RuntimeError("the app broke in its body")


def _answer(app: Callable[..., Awaitable[None]]) -> bytes:
    """Everything the server sends for one GET, read until it closes the connection."""

    async def exchange() -> bytes:
        loop = asyncio.get_running_loop()
        config = uvicorn.Config(app, lifespan="off", log_config=None)
        state = ServerState()
        server = await loop.create_server(
            lambda: Connection(config, state, {}, loop), "127.0.0.1", 0
        )
        try:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nhost: test\r\n\r\n")
            try:
                return await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
        finally:
            server.close()

    return asyncio.run(exchange())


@pytest.mark.parametrize("app", [fails_after_start, returns_after_start, sends_a_bad_header])
def test_an_answer_that_sent_nothing_yet_becomes_a_500(app: Any) -> None:
    answer = _answer(app)
    assert answer.startswith(b"HTTP/1.1 500 "), answer
    assert answer.endswith(b"\r\n\r\nInternal Server Error")
    assert b"content-length: 5" not in answer.lower()


def test_an_answer_that_sent_bytes_is_cut_off_where_it_stopped() -> None:
    answer = _answer(fails_mid_body)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"\r\n\r\nab")
