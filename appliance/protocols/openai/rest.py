"""OpenAI's inference API on the HTTP frontend, under ``[openai] prefix`` (``/v1``).

SPEC: OpenAI's API reference, and Triton's OpenAI frontend for what a model
is sent (convention.py; docs/protocols/openai.md)::

    POST /v1/chat/completions   messages in, the assistant's text out; stream: SSE chunks
    POST /v1/completions        a prompt in, its continuation out; stream: SSE chunks
    POST /v1/embeddings         texts in, a vector each (floats, or float32 base64)
    GET  /v1/models[/{model}]   the models served

A stream is ``data: <chunk JSON>`` events ending with ``data: [DONE]``; a
failure is OpenAI's error object, with its status before a stream begins and
as the stream's last event after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
import numpy as np
import orjson

from appliance.client.api import ModelClient
from appliance.core.metadata import ModelMetadata
from appliance.errors import ModelNotFound
from appliance.protocols.bodies import read_body
from appliance.protocols.jsonbody import load_object
from appliance.protocols.openai import answers, convention
from appliance.protocols.openai.answers import Completion
from appliance.protocols.openai.errors import (
    encode_error,
    from_error,
    invalid,
    model_not_found,
    render,
)
from appliance.protocols.openai.generate import Run, first_piece
from appliance.protocols.openai.requests import (
    Generation,
    chat_request,
    completion_request,
    embedding_request,
)
from appliance.protocols.openai.texts import Texts, tokenizer_dir
from appliance.protocols.web import App, guarded, send_events

responder = guarded(render)
DONE = falcon.asgi.SSEvent(data=b"[DONE]")
_STARTED = int(time.time())
# An embeddings request's texts in flight at once: enough to fill a batch many times over.
EMBEDDINGS_IN_FLIGHT = 64


class Route:
    """What the routes share: the client, the body limit, each model's texts."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client
        self.limit = client.config.http.max_body_bytes
        self.config = client.config.openai
        self.settings = convention.Settings(self.config.default_max_tokens)
        # Each model's tokenizer directory, found again when its entry changes (a reload).
        self._texts: dict[str, tuple[tuple[Any, ...], Texts]] = {}

    def body(self, req: falcon.Request) -> dict[str, Any]:
        return load_object(read_body(req, self.limit), invalid)

    def metadata(self, model: str) -> ModelMetadata:
        try:
            return self.client.metadata(model)
        except ModelNotFound:
            raise model_not_found(model) from None

    def texts(self, model: str) -> Texts:
        options = self._options(model)
        key = (options.get("path"), options.get("stamp"), options.get("tokenizer"))
        known = self._texts.get(model)
        if known is None or known[0] != key:
            path = options.get("path")
            model_dir = Path(path).parent.parent if isinstance(path, str) else None
            directory = tokenizer_dir(options, self.config.tokenizer, model_dir)
            known = self._texts[model] = (key, Texts(directory))
        return known[1]

    def _options(self, model: str) -> Mapping[str, Any]:
        configured = self.client.config.model(model)
        return configured.options if configured is not None else {}


class Completions(Route):
    """``/chat/completions`` (``chat``) or ``/completions``."""

    def __init__(self, client: ModelClient, chat: bool) -> None:
        super().__init__(client)
        self.chat = chat

    @responder
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = self.body(req)
        generation = chat_request(body) if self.chat else completion_request(body)
        metadata = self.metadata(generation.model)
        if not convention.is_generative(metadata):
            raise invalid(
                f"model {generation.model} generates no text: a generative model takes a "
                f"BYTES input {convention.TEXT_INPUT} and gives a BYTES output "
                f"{convention.TEXT_OUTPUT} (docs/protocols/openai.md)",
                "model",
            )
        texts = self.texts(metadata.name)
        prompt = self._prompt(metadata, generation, texts)
        inputs = convention.generation_inputs(metadata, generation, prompt, self.settings)
        max_tokens = generation.max_tokens or self.settings.default_max_tokens
        run = Run(self.client, metadata, generation, prompt, texts, max_tokens)
        completion = Completion(generation.model, self.chat)
        pieces = run.pieces(inputs, completion.id)
        first = await first_piece(pieces)
        if generation.stream:
            send_events(resp, _events(completion, run, first, pieces, generation.include_usage))
            return
        async for _ in pieces:
            pass
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(completion.whole(run.text, run.finish_reason, run.usage()))

    def _prompt(self, metadata: ModelMetadata, generation: Generation, texts: Texts) -> str:
        if not generation.chat:
            return generation.prompt or ""
        if convention.takes_messages(metadata) and texts.template is None:
            return ""  # the model renders the messages itself
        return texts.render(generation.messages, metadata.name)


async def _events(
    completion: Completion,
    run: Run,
    first: str | None,
    pieces: AsyncGenerator[str, None],
    include_usage: bool,
) -> AsyncIterator[falcon.asgi.SSEvent]:
    """The stream's chunks: (a chat's role,) each piece, the finish, (the usage,) [DONE]."""
    try:
        if completion.chat:
            yield _event(completion.chunk("", role=True))
        if first is not None:
            yield _event(completion.chunk(first))
        async for piece in pieces:
            yield _event(completion.chunk(piece))
        yield _event(completion.chunk(None, run.finish_reason))
        if include_usage:
            yield _event(completion.usage_chunk(run.usage()))
        yield DONE
    except Exception as ex:
        # The status has gone: the error is the stream's last event, which the
        # openai client raises from its iterator.
        yield falcon.asgi.SSEvent(data=encode_error(from_error(ex)))
    finally:
        await pieces.aclose()


def _event(document: dict[str, Any]) -> falcon.asgi.SSEvent:
    return falcon.asgi.SSEvent(data=orjson.dumps(document))


class Embeddings(Route):
    @responder
    async def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        request = embedding_request(self.body(req))
        metadata = self.metadata(request.model)
        form = convention.embedding_model(metadata)
        if form is None:
            raise invalid(
                f"model {request.model} makes no embeddings: an embedding model is not "
                "decoupled and takes one BYTES input (text_input) and gives a float output "
                "(embedding), a vector per text (docs/protocols/openai.md)",
                "model",
            )

        # One request per text: the batcher batches them, and other clients' too. At
        # most EMBEDDINGS_IN_FLIGHT at once: OpenAI allows 2,048 texts a request, more
        # than a model's queue holds (max_queue, 1,024 by default).
        slots = asyncio.Semaphore(EMBEDDINGS_IN_FLIGHT)

        async def one(text: str) -> np.ndarray[Any, Any]:
            async with slots:
                result = await self.client.infer_async(metadata.name, form.inputs(text))
            with result:
                return form.vector_of(result.outputs, metadata.name).copy()

        vectors = await asyncio.gather(*(one(text) for text in request.texts))
        size = len(vectors[0])
        if request.dimensions is not None and request.dimensions != size:
            raise invalid(
                f"dimensions={request.dimensions}: model {request.model} makes vectors of "
                f"{size} dimensions",
                "dimensions",
            )
        texts = self.texts(metadata.name)
        counts = [texts.count(text) for text in request.texts]
        tokens = sum(count or 0 for count in counts)
        document = answers.embeddings(request.model, vectors, request.base64, tokens)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(document)


class Models(Route):
    @responder
    def on_get(self, req: falcon.Request, resp: falcon.Response, model: str = "") -> None:
        if model:
            if model not in self.client.models():
                raise model_not_found(model)
            document = answers.model_object(model, self._created(model))
        else:
            document = {
                "object": "list",
                "data": [
                    answers.model_object(name, self._created(name)) for name in self.client.models()
                ],
            }
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(document)

    def _created(self, model: str) -> int:
        """When the model's file was made, or when this frontend started."""
        path = self._options(model).get("path")
        if isinstance(path, str):
            try:
                return int(Path(path).stat().st_mtime)
            except OSError:
                pass
        return _STARTED


def add_routes(app: App, client: ModelClient) -> None:
    """Mount OpenAI's routes under the configured prefix."""
    prefix = client.config.openai.prefix.rstrip("/")
    app.add_route(f"{prefix}/chat/completions", Completions(client, chat=True))
    app.add_route(f"{prefix}/completions", Completions(client, chat=False))
    app.add_route(f"{prefix}/embeddings", Embeddings(client))
    models = Models(client)
    app.add_route(f"{prefix}/models", models)
    app.add_route(f"{prefix}/models/{{model}}", models)
