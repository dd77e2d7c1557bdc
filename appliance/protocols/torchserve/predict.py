"""A TorchServe inference call through the client API, for REST and gRPC alike.

:func:`model_metadata` checks the model and version named (TorchServe's 404s),
:func:`answers` calls the model and yields its answers: one for a handler
that answers once, one per part for a handler that streams (the model says
so in its metadata, as a decoupled model does). Each answer is its body and
the response parameters the handler set (status, content type, headers).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from appliance.client.api import ModelClient
from appliance.core.http_body import BODY
from appliance.core.metadata import ModelMetadata
from appliance.core.output_parameters import response_from_body
from appliance.errors import ModelNotFound
from appliance.protocols.torchserve.errors import (
    TorchServeError,
    model_not_found,
    version_not_found,
)
from appliance.protocols.torchserve.request import Call

Answer = tuple[bytes, dict[str, Any]]


def model_metadata(client: ModelClient, model: str, version: str | None) -> ModelMetadata:
    """The model's metadata, after checking it serves ``version`` (when named).

    Raises:
        TorchServeError: no such model, or not that version.
    """
    try:
        metadata = client.metadata(model)
    except ModelNotFound:
        raise model_not_found(model) from None
    if version is not None and version not in metadata.versions:
        raise version_not_found(model, version)
    return metadata


async def answers(
    client: ModelClient, metadata: ModelMetadata, call: Call, request_id: str
) -> AsyncGenerator[Answer, None]:
    """The model's answers to ``call``: one, or each part of its stream as it comes.

    Closing the iterator early cancels the stream in the model's worker.
    """
    model = metadata.name
    if not metadata.supports.get("predict_stream"):
        result = await client.infer_async(
            model, call.inputs, parameters=call.parameters, request_id=request_id
        )
        with result:
            yield answer_of(model, result)
        return
    stream = client.stream_async(model, call.inputs, None, call.parameters, None, request_id)
    async with contextlib.aclosing(stream) as parts:
        async for part in parts:
            yield answer_of(model, part)


def answer_of(model: str, result: Any) -> Answer:
    """The body of a model's answer (a copy) and the response parameters it set."""
    tensor = result.outputs.get(BODY)
    if tensor is None:
        raise TorchServeError(
            500,
            "InternalServerException",
            f"model {model} answered no {BODY!r} output: it is not a TorchServe "
            f"handler's model; call it over KServe v2 (/v2/models/{model}/infer)",
        )
    values = tensor.array().reshape(-1)
    return (bytes(values[0]) if values.size else b""), response_from_body(result.body)
