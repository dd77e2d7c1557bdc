"""The objects OpenAI's API answers with: completions, their stream's chunks, embeddings, models.

Field names and order are OpenAI's; what the appliance does not compute is
null where OpenAI's schema allows it (``logprobs``, ``system_fingerprint``)
and left out where it may be absent. Pure: values in, dicts out.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

OWNER = "appliance"


@dataclass
class Usage:
    """Token counts: the model's own where it gave them, else the tokenizer's; None unknown."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def document(self) -> dict[str, int] | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


class Completion:
    """The frame every object of one completion shares: its id, time, model and kind."""

    def __init__(self, model: str, chat: bool) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def whole(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        """The answer of a request that did not stream."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": usage.document()}

    def chunk(
        self, text: str | None, finish_reason: str | None = None, role: bool = False
    ) -> dict[str, Any]:
        """One chunk of a stream: a piece of text, or the finish (``text`` None)."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return {**self._head(self._chunk_kind()), "choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last chunk ``stream_options.include_usage`` asks for: no choices, the usage."""
        counts = usage.document() or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return {**self._head(self._chunk_kind()), "choices": [], "usage": counts}

    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def embeddings(
    model: str, vectors: list[np.ndarray[Any, Any]], as_base64: bool, prompt_tokens: int
) -> dict[str, Any]:
    """The embeddings list: a float list per text, or its float32 bytes in base64."""
    data = []
    for index, vector in enumerate(vectors):
        values: Any
        if as_base64:
            values = base64.b64encode(vector.astype("<f4").tobytes()).decode()
        else:
            values = vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": values})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER}
