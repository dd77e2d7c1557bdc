"""A completion run through the model client: its text piece by piece, its usage, its end.

:class:`Run` calls a generative model (convention.py) once and turns its
responses into text: a decoupled model's every response is a delta, any
other model's one response the whole text. On the way it applies what the
model may not: ``stop`` sequences end the text before them (held back while
a piece could still become one) and stop the model; ``echo`` puts the prompt
first where the model cannot (no ``exclude_input_in_output`` input).
Closing the run early (a client gone) cancels the model's stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from appliance.client.api import ModelClient
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor
from appliance.protocols.openai.answers import Usage
from appliance.protocols.openai.convention import INPUT_TOKENS, OUTPUT_TOKENS, count_of, text_of
from appliance.protocols.openai.requests import Generation
from appliance.protocols.openai.texts import Texts


class StopScan:
    """Cut a stream of text before the first of some stop sequences."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """What of ``piece`` may go out now.

        The text ends before the stop sequence that starts first, as if it had
        come whole: a stop sequence found waits while a longer one could still
        complete from an earlier place ("baa" for stops "a" and "baa" ends
        before "baa", though its "a" came first).
        """
        if not self.stops:
            return piece
        text = self.held + piece
        first = self._first(text)
        pending = self._pending(text, len(text) if first < 0 else first)
        if first >= 0 and pending >= first:
            self.held, self.stopped = "", True
            return text[:first]
        self.held = text[pending:]
        return text[:pending]

    def rest(self) -> str:
        """What was held back, once the text has ended (cut before a stop sequence in it)."""
        held, self.held = self.held, ""
        first = self._first(held)
        if first >= 0:
            self.stopped = True
            return held[:first]
        return held

    def _first(self, text: str) -> int:
        """Where the first stop sequence in ``text`` starts (-1: none)."""
        found = [at for at in (text.find(stop) for stop in self.stops) if at >= 0]
        return min(found, default=-1)

    def _pending(self, text: str, limit: int) -> int:
        """The first place before ``limit`` from which ``text`` could still become a
        stop sequence (its tail a stop's beginning); ``limit`` where there is none."""
        earliest = limit
        for stop in self.stops:
            # The longest tail first: it starts earliest.
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                at = len(text) - size
                if at >= earliest:
                    break
                if stop.startswith(text[at:]):
                    earliest = at
                    break
        return earliest


class Run:
    """One completion: the model's responses as text, then its usage and finish reason."""

    def __init__(
        self,
        client: ModelClient,
        metadata: ModelMetadata,
        generation: Generation,
        prompt: str,
        texts: Texts,
        max_tokens: int,
    ) -> None:
        self.client = client
        self.metadata = metadata
        self.generation = generation
        self.prompt = prompt
        self.texts = texts
        self.max_tokens = max_tokens
        self.text = ""
        self.finish_reason = "stop"
        self._prompt_tokens: int | None = None
        self._completion_tokens: int | None = None
        self._scan = StopScan(generation.stop)
        # The model echoes the prompt itself where it takes exclude_input_in_output.
        self._echo = generation.echo and metadata.input("exclude_input_in_output") is None

    async def pieces(self, inputs: dict[str, Tensor], request_id: str) -> AsyncGenerator[str, None]:
        """The text as it comes (empty pieces left out); closing it cancels the model."""
        if self._echo:
            self.text = self.prompt
            yield self.prompt
        async with contextlib.aclosing(self._responses(inputs, request_id)) as responses:
            async for outputs in responses:
                self._count(outputs)
                piece = self._scan.feed(text_of(outputs))
                if piece:
                    self.text += piece
                    yield piece
                if self._scan.stopped:
                    return  # the model's stream is cancelled as this closes
        rest = self._scan.rest()
        if rest:
            self.text += rest
            yield rest
        if self._scan.stopped:
            return
        if self._completion_tokens is not None and self._completion_tokens >= self.max_tokens:
            self.finish_reason = "length"

    async def _responses(
        self, inputs: dict[str, Tensor], request_id: str
    ) -> AsyncGenerator[dict[str, Tensor], None]:
        model = self.metadata.name
        if not self.metadata.supports.get("predict_stream"):
            result = await self.client.infer_async(model, inputs, request_id=request_id)
            with result:
                yield result.outputs
            return
        stream = self.client.stream_async(model, inputs, None, None, None, request_id)
        async with contextlib.aclosing(stream) as parts:
            async for part in parts:
                yield part.outputs

    def _count(self, outputs: dict[str, Tensor]) -> None:
        given = count_of(outputs, INPUT_TOKENS)
        if given is not None and self._prompt_tokens is None:
            self._prompt_tokens = given
        made = count_of(outputs, OUTPUT_TOKENS)
        if made is not None:
            self._completion_tokens = (self._completion_tokens or 0) + made

    def usage(self) -> Usage:
        """The model's counts, else the tokenizer's, else unknown (None)."""
        prompt = self._prompt_tokens
        if prompt is None:
            prompt = self.texts.count(self.prompt)
        completion = self._completion_tokens
        if completion is None:
            completion = self.texts.count(self.text)
        return Usage(prompt, completion)


async def first_piece(pieces: AsyncGenerator[str, None]) -> str | None:
    """The first piece (None: none came); ``pieces`` goes on after it.

    A request the model refuses fails here, before a response has begun.
    """
    try:
        return await anext(pieces, None)
    except BaseException:
        await pieces.aclose()
        raise
