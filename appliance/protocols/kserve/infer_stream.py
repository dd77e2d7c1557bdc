"""A streaming (decoupled) model's answers to a KServe request, part by part, and as events.

Beside ``infer``, which runs the one-answer request (and is compiled with
the request path, appliance/native.py): an async generator, which mypyc
does not compile.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import falcon.asgi
import orjson

from appliance.client.api import ModelClient
from appliance.errors import ApplianceError, BadRequest
from appliance.protocols.kserve.infer import outputs_of, prepare
from appliance.protocols.kserve.inference import InferRequest, OutputData
from appliance.protocols.kserve.shm import RegionTable


async def stream_async(
    client: ModelClient, regions: RegionTable, request: InferRequest, timeout_s: float | None
) -> AsyncGenerator[list[OutputData], None]:
    """Yield the outputs of each part a streaming (decoupled) model sends.

    The parts are awaited in the event loop. Closing the generator early
    (``aclose``) cancels the stream in the worker.
    """
    if any(output.shm for output in request.outputs or ()):
        raise BadRequest("outputs of a streamed (decoupled) model cannot go to shared memory")
    call = prepare(client, regions, request)
    stream = client.stream_async(
        call.model, call.inputs, call.names, call.parameters, timeout_s, request.id
    )
    async with contextlib.aclosing(stream) as parts:
        async for part in parts:
            yield outputs_of(request, part.outputs, {}, part.body)


def decoupled(client: ModelClient, model: str) -> bool:
    """Return True when the model streams its answers (Triton's "decoupled")."""
    return bool(client.metadata(model).supports.get("predict_stream"))


async def events(
    first: bytes | None,
    rest: AsyncGenerator[list[OutputData], None] | None,
    encode: Callable[[list[OutputData]], bytes] | None = None,
) -> AsyncIterator[falcon.asgi.SSEvent]:
    """The events of a stream: the first answer, then each further part's (SSE)."""
    try:
        if first is not None:
            yield falcon.asgi.SSEvent(data=first)
        if rest is None or encode is None:
            return
        try:
            async for outputs in rest:
                yield falcon.asgi.SSEvent(data=encode(outputs))
        except ApplianceError as ex:
            yield falcon.asgi.SSEvent(data=orjson.dumps({"error": ex.message}))
    finally:
        if rest is not None:
            await rest.aclose()
