"""Which models answer OpenAI's routes, and the tensors they take and give.

A generative model follows the convention of Triton's OpenAI frontend, so a
decoupled Python-backend model written for it serves unmodified: a BYTES
input ``text_input`` (the prompt) and a BYTES output ``text_output`` (the
text, one delta per streamed response). The request's settings go to the
inputs the model declares, by Triton's names and types::

    stream BOOL, max_tokens INT32, temperature / top_p / frequency_penalty /
    presence_penalty FP32, seed UINT64, stop_words BYTES (one per sequence),
    return_num_input_tokens / return_num_output_tokens BOOL,
    exclude_input_in_output BOOL (not echo), sampling_parameters BYTES (the
    settings as one JSON object, as Triton's vLLM backend takes them),
    messages BYTES (a chat's messages as JSON, for a model that renders its
    own prompt)

each shaped as declared (``[1]`` or ``[1, 1]``; ``stop_words`` ``[1, N]``).
Triton sends an input only where its model declares it; so does the
appliance, and a required input it cannot fill refuses the model by name.
Outputs ``num_input_tokens`` and ``num_output_tokens`` (per response), where
given, are the usage's counts.

An embedding model: not decoupled, a BYTES input (``text_input``, ``input``
or its only BYTES input) and a floating-point output (``embedding``,
``embeddings`` or its only float output), one vector per text. Each text is
one request, so the dynamic batcher batches the texts of a request and of
concurrent ones alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.core.dtypes import DType, to_numpy
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, TensorSpec
from appliance.protocols.openai.errors import invalid
from appliance.protocols.openai.requests import Generation

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
INPUT_TOKENS = "num_input_tokens"
OUTPUT_TOKENS = "num_output_tokens"
_FLOATS = (DType.FP16, DType.FP32, DType.FP64)


@dataclass(frozen=True)
class Settings:
    """What the routes fill in that a request left out (Triton's defaults)."""

    # Triton's --default-max-tokens.
    default_max_tokens: int = 16


def is_generative(metadata: ModelMetadata) -> bool:
    text_in = metadata.input(TEXT_INPUT)
    text_out = metadata.output(TEXT_OUTPUT)
    return (
        text_in is not None
        and text_in.dtype is DType.BYTES
        and text_out is not None
        and text_out.dtype is DType.BYTES
    )


def takes_messages(metadata: ModelMetadata) -> bool:
    """Whether a generative model renders a chat's prompt itself (a ``messages`` input)."""
    spec = metadata.input("messages")
    return spec is not None and spec.dtype is DType.BYTES


def generation_inputs(
    metadata: ModelMetadata, generation: Generation, prompt: str, settings: Settings
) -> dict[str, Tensor]:
    """The model's inputs for ``generation``: each it declares that the request fills.

    Raises:
        OpenAIError: the model requires an input these routes cannot give.
    """
    values = _generation_values(generation, prompt, settings)
    inputs: dict[str, Tensor] = {}
    for spec in metadata.inputs or ():
        value = values.get(spec.name)
        if value is None:
            if not spec.optional:
                raise invalid(
                    f"model {metadata.name} requires input {spec.name}, which OpenAI's "
                    f"routes do not give (they fill {', '.join(sorted(_NAMES))}); call it "
                    f"over KServe v2 (/v2/models/{metadata.name}/infer)",
                    "model",
                )
            continue
        inputs[spec.name] = _tensor(spec, value, metadata.max_batch_size > 0)
    return inputs


_NAMES = frozenset(
    {
        TEXT_INPUT,
        "stream",
        "max_tokens",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "seed",
        "stop_words",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "exclude_input_in_output",
        "sampling_parameters",
        "messages",
        "return_logprobs",
    }
)


def _generation_values(generation: Generation, prompt: str, settings: Settings) -> dict[str, Any]:
    """Each conventional input's values (a list), as Triton fills them."""
    max_tokens = generation.max_tokens or settings.default_max_tokens
    # Triton's schema defaults: sent whether or not the request gave them.
    temperature = generation.temperature
    if temperature is None:
        temperature = 0.7 if generation.chat else 1.0
    sampling: dict[str, Any] = {
        "frequency_penalty": generation.frequency_penalty or 0.0,
        "n": generation.n,
        "presence_penalty": generation.presence_penalty or 0.0,
        "temperature": temperature,
        "top_p": 1.0 if generation.top_p is None else generation.top_p,
        "max_tokens": max_tokens,
        "ignore_eos": False,
    }
    values: dict[str, Any] = {
        TEXT_INPUT: [prompt.encode()],
        "stream": [generation.stream],
        "max_tokens": [max_tokens],
        "temperature": [temperature],
        "top_p": [sampling["top_p"]],
        "frequency_penalty": [sampling["frequency_penalty"]],
        "presence_penalty": [sampling["presence_penalty"]],
        "return_num_input_tokens": [True],
        "return_num_output_tokens": [True],
        "return_logprobs": [False],
        "exclude_input_in_output": [not generation.echo],
    }
    if generation.seed is not None:
        values["seed"] = [generation.seed]
        sampling["seed"] = generation.seed
    if generation.stop:
        values["stop_words"] = [stop.encode() for stop in generation.stop]
        sampling["stop"] = generation.stop
    values["sampling_parameters"] = [json.dumps(sampling).encode()]
    if generation.chat:
        values["messages"] = [json.dumps(generation.messages).encode()]
    return values


def _tensor(spec: TensorSpec, values: list[Any], batched: bool) -> Tensor:
    """``values`` in the spec's type and shape: one row of a batch when ``batched``."""
    dims = list(spec.shape[1:] if batched else spec.shape)
    shape = _fit(spec.name, dims, len(values))
    if batched:
        shape = (1, *shape)
    if spec.dtype is DType.BYTES:
        array = np.empty(len(values), dtype=object)
        array[:] = values
    else:
        try:
            array = np.array(values, dtype=to_numpy(spec.dtype))
        except (OverflowError, ValueError):
            raise invalid(
                f"{spec.name}: {values[0]!r} does not fit the model's {spec.dtype.value}",
                spec.name,
            ) from None
    return Tensor(spec.dtype, shape, array.reshape(shape))


def _fit(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """A shape of ``count`` values in dims where -1 is any size: the last free dim takes them."""
    fixed = 1
    for dim in dims:
        fixed *= dim if dim >= 0 else 1
    free = [index for index, dim in enumerate(dims) if dim < 0]
    if count % fixed or (not free and count != fixed):
        raise invalid(f"input {name}: {count} value(s) do not fit the model's shape {dims}", name)
    shape = [1 if dim < 0 else dim for dim in dims]
    if free:
        shape[free[-1]] = count // fixed
    return tuple(shape)


def text_of(outputs: Mapping[str, Tensor]) -> str:
    """A response's text: its ``text_output`` (the elements joined), "" without one."""
    tensor = outputs.get(TEXT_OUTPUT)
    if tensor is None:
        return ""
    parts = []
    for item in tensor.array().reshape(-1):
        parts.append(item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item))
    return "".join(parts)


def count_of(outputs: Mapping[str, Tensor], name: str) -> int | None:
    """A token count the model gave (its first element), or None."""
    tensor = outputs.get(name)
    if tensor is None or tensor.dtype is DType.BYTES or tensor.element_count == 0:
        return None
    return int(tensor.array().reshape(-1)[0])


# -- embeddings -----------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddingModel:
    """An embedding model's text input and vector output."""

    text: TensorSpec
    vector: TensorSpec
    batched: bool

    def inputs(self, text: str) -> dict[str, Tensor]:
        return {self.text.name: _tensor(self.text, [text.encode()], self.batched)}

    def vector_of(self, outputs: Mapping[str, Tensor], model: str) -> np.ndarray[Any, Any]:
        tensor = outputs.get(self.vector.name)
        if tensor is None:
            raise invalid(f"model {model} answered no {self.vector.name} output", "model")
        return np.asarray(tensor.array(), dtype=np.float32).reshape(-1)


def embedding_model(metadata: ModelMetadata) -> EmbeddingModel | None:
    """The model's text input and vector output, or None where it has no such pair."""
    if metadata.supports.get("predict_stream"):
        return None
    texts = [s for s in metadata.inputs or () if s.dtype is DType.BYTES]
    vectors = [s for s in metadata.outputs or () if s.dtype in _FLOATS]
    text = _pick(texts, ("text_input", "input", "text"))
    vector = _pick(vectors, ("embedding", "embeddings"))
    if text is None or vector is None:
        return None
    others = [s for s in metadata.inputs or () if s is not text and not s.optional]
    if others:
        return None
    return EmbeddingModel(text, vector, metadata.max_batch_size > 0)


def _pick(specs: list[TensorSpec], names: tuple[str, ...]) -> TensorSpec | None:
    for name in names:
        for spec in specs:
            if spec.name == name:
                return spec
    return specs[0] if len(specs) == 1 else None
