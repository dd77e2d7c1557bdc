"""OpenAI request bodies read and checked: chat and text completions, embeddings.

Each body becomes a plain record of what the appliance passes on; every
field OpenAI defines that the appliance cannot honour is refused by name
(400, ``param`` naming it), fields that change nothing here (``user``,
``store``, ``metadata``, ...) are accepted and dropped, and an unknown field
is refused, as OpenAI's own API refuses it. Ranges are OpenAI's.

Pure: a parsed JSON object in, a record out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from appliance.protocols.jsonbody import kind_of
from appliance.protocols.openai.errors import invalid

# Fields that change nothing the appliance does: accepted, not passed on.
_DROPPED = frozenset(
    {
        "user",
        "store",
        "metadata",
        "service_tier",
        "parallel_tool_calls",
        "prompt_cache_key",
        "safety_identifier",
    }
)
_SAMPLING = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "seed",
        "stop",
        "n",
        "logprobs",
        "logit_bias",
    }
)
_CHAT = _SAMPLING | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "modalities",
    "audio",
    "reasoning_effort",
}
_COMPLETION = _SAMPLING | {"prompt", "echo", "suffix", "best_of"}
_EMBEDDING = frozenset({"model", "input", "encoding_format", "dimensions"})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_STOP = 4
# A stop sequence's most characters: the text that could still become one waits, and is
# looked through at each piece of the text (protocols/openai/generate.py).
MAX_STOP_CHARS = 256
MAX_EMBEDDING_INPUTS = 2048


@dataclass
class Generation:
    """What a chat or text completion asks of a generative model."""

    model: str
    chat: bool
    # The completion's prompt; a chat's is rendered from its messages.
    prompt: str | None = None
    # A chat's messages, each {"role", "content"[, "name"]} with text content.
    messages: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    echo: bool = False


@dataclass
class Embedding:
    """What an embeddings request asks: a vector per text."""

    model: str
    texts: list[str]
    base64: bool = False
    dimensions: int | None = None


def chat_request(body: dict[str, Any]) -> Generation:
    """A ``/chat/completions`` body (a JSON object)."""
    _known(body, _CHAT)
    generation = _sampling(body, chat=True)
    generation.messages = _messages(body.get("messages"))
    limit = _optional_int(body, "max_completion_tokens", 1)
    if limit is not None:
        generation.max_tokens = limit
    if body.get("tools") or body.get("functions"):
        name = "tools" if body.get("tools") else "functions"
        raise invalid(f"{name} are not supported: the models answer text alone", name)
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise invalid(f"{name} is not supported: the models answer text alone", name)
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise invalid('response_format: only {"type": "text"} is supported', "response_format")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise invalid('modalities: only ["text"] is supported', "modalities")
    if body.get("audio") is not None:
        raise invalid("audio output is not supported", "audio")
    if body.get("top_logprobs") is not None:
        raise invalid(
            "top_logprobs is not supported: the models return no log probabilities", "top_logprobs"
        )
    return generation


def completion_request(body: dict[str, Any]) -> Generation:
    """A ``/completions`` body (a JSON object)."""
    _known(body, _COMPLETION)
    generation = _sampling(body, chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise invalid(
            "prompt must be one string (a list of prompts or of token ids is not supported; "
            f"got {kind_of(prompt)})",
            "prompt",
        )
    generation.prompt = prompt
    generation.echo = _bool(body, "echo")
    if body.get("suffix") not in (None, ""):
        raise invalid("suffix is not supported", "suffix")
    if body.get("best_of") not in (None, 1):
        raise invalid("best_of is not supported: one completion per request", "best_of")
    return generation


def embedding_request(body: dict[str, Any]) -> Embedding:
    """An ``/embeddings`` body (a JSON object)."""
    _known(body, _EMBEDDING)
    model = _model(body)
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts:
        raise invalid(f"input must be a string or a list of strings, got {kind_of(given)}", "input")
    if not all(isinstance(text, str) for text in texts):
        raise invalid("input: token ids are not supported; send the texts as strings", "input")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise invalid(
            f"input: at most {MAX_EMBEDDING_INPUTS} texts per request, got {len(texts)}", "input"
        )
    if any(not text for text in texts):
        raise invalid("input: an empty string has no embedding", "input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise invalid(
            f'encoding_format must be "float" or "base64", got {encoding!r}', "encoding_format"
        )
    dimensions = _optional_int(body, "dimensions", 1)
    return Embedding(model, texts, encoding == "base64", dimensions)


# -- the parts -------------------------------------------------------------------


def _known(body: dict[str, Any], known: frozenset[str]) -> None:
    for name in body:
        if name not in known and name not in _DROPPED:
            raise invalid(f"Unrecognized request argument supplied: {name}", name)


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid(
            f"model must name a served model (GET /v1/models lists them), got {kind_of(model)}",
            "model",
        )
    return model


def _sampling(body: dict[str, Any], chat: bool) -> Generation:
    generation = Generation(model=_model(body), chat=chat)
    generation.stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not generation.stream:
            raise invalid("stream_options is only allowed when stream is true", "stream_options")
        if not isinstance(options, dict):
            raise invalid(
                f"stream_options must be an object, got {kind_of(options)}", "stream_options"
            )
        generation.include_usage = bool(options.get("include_usage", False))
    generation.max_tokens = _optional_int(body, "max_tokens", 1)
    generation.temperature = _optional_number(body, "temperature", 0.0, 2.0)
    generation.top_p = _optional_number(body, "top_p", 0.0, 1.0)
    generation.frequency_penalty = _optional_number(body, "frequency_penalty", -2.0, 2.0)
    generation.presence_penalty = _optional_number(body, "presence_penalty", -2.0, 2.0)
    generation.seed = _optional_int(body, "seed", None)
    generation.stop = _stop(body.get("stop"))
    n = _optional_int(body, "n", 1)
    if n is not None and n != 1:
        raise invalid(f"n={n}: one choice per request (n=1) is supported", "n")
    if body.get("logprobs") not in (None, False, 0):
        raise invalid(
            "logprobs are not supported: the models return no log probabilities", "logprobs"
        )
    if body.get("logit_bias"):
        raise invalid("logit_bias is not supported", "logit_bias")
    return generation


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise invalid(f"messages must be a non-empty array, got {kind_of(value)}", "messages")
    messages = []
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(f"{where} must be an object, got {kind_of(message)}", where)
        role = message.get("role")
        if role not in ROLES:
            raise invalid(
                f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}",
                f"{where}.role",
            )
        if message.get("tool_calls"):
            raise invalid(f"{where}: tool calls are not supported", f"{where}.tool_calls")
        text = _content(message.get("content"), role, where)
        kept: dict[str, Any] = {"role": role, "content": text}
        if isinstance(message.get("name"), str):
            kept["name"] = message["name"]
        messages.append(kept)
    return messages


def _content(content: Any, role: str, where: str) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else kind_of(part)
                raise invalid(
                    f"{where}.content: only text parts are supported, got {kind!r}",
                    f"{where}.content",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid(
                    f"{where}.content: a text part's text must be a string", f"{where}.content"
                )
            texts.append(text)
        return "".join(texts)
    raise invalid(
        f"{where}.content must be a string or an array of text parts, got {kind_of(content)}",
        f"{where}.content",
    )


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop must be a string or an array of non-empty strings", "stop")
    if len(stops) > MAX_STOP:
        raise invalid(f"stop: at most {MAX_STOP} sequences, got {len(stops)}", "stop")
    longest = max((len(stop) for stop in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise invalid(
            f"stop: a sequence has at most {MAX_STOP_CHARS} characters, got {longest}", "stop"
        )
    return list(stops)


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean, got {kind_of(value)}", name)
    return value


def _optional_int(body: dict[str, Any], name: str, least: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise invalid(f"{name} must be an integer, got {kind_of(value)}", name)
    if least is not None and value < least:
        raise invalid(f"{name} must be at least {least}, got {value}", name)
    return value


def _optional_number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) not in (int, float):
        raise invalid(f"{name} must be a number, got {kind_of(value)}", name)
    if not low <= value <= high:
        raise invalid(f"{name} must be between {low:g} and {high:g}, got {value}", name)
    return float(value)
