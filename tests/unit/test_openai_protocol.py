"""OpenAI's request checks, the tensors a model is sent, stop sequences and chat templates."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import spec
from appliance.protocols.openai import convention
from appliance.protocols.openai.errors import OpenAIError
from appliance.protocols.openai.generate import StopScan
from appliance.protocols.openai.requests import (
    chat_request,
    completion_request,
    embedding_request,
)
from appliance.protocols.openai.texts import Texts, tokenizer_dir

USER = [{"role": "user", "content": "hi"}]


def refused(body: dict[str, Any], parse: Any = chat_request) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        parse(body)
    assert caught.value.status == 400
    return caught.value


def test_a_chat_request_keeps_what_is_passed_on() -> None:
    chat = chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 9,
            "stop": "x",
            "user": "dropped",
        }
    )
    assert [m["content"] for m in chat.messages] == ["be brief", "ab", ""]
    assert (chat.stream, chat.include_usage, chat.max_tokens, chat.stop) == (True, True, 9, ["x"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": USER, "n": 2}, "n"),
        ({"model": "m", "messages": USER, "temperature": 2.5}, "temperature"),
        ({"model": "m", "messages": USER, "top_p": -0.1}, "top_p"),
        ({"model": "m", "messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": USER, "max_tokens": 1.5}, "max_tokens"),
        ({"model": "m", "messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "m", "messages": USER, "stop": ["x" * 100_000]}, "stop"),
        ({"model": "m", "messages": USER, "stream_options": {}}, "stream_options"),
        ({"model": "m", "messages": USER, "logprobs": True}, "logprobs"),
        ({"model": "m", "messages": USER, "tools": [{"type": "function"}]}, "tools"),
        ({"model": "m", "messages": USER, "frob": 1}, "frob"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"messages": USER}, "model"),
    ],
)
def test_a_chat_request_is_refused_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(body).param == param


def test_completions_and_embeddings_take_strings() -> None:
    assert completion_request({"model": "m", "prompt": ["one"]}).prompt == "one"
    assert refused({"model": "m", "prompt": [1, 2]}, completion_request).param == "prompt"
    assert (
        refused({"model": "m", "prompt": "x", "suffix": "y"}, completion_request).param == "suffix"
    )
    texts = embedding_request({"model": "e", "input": ["a", "b"], "encoding_format": "base64"})
    assert (texts.texts, texts.base64) == (["a", "b"], True)
    assert refused({"model": "e", "input": [[1, 2]]}, embedding_request).param == "input"
    assert refused({"model": "e", "input": ""}, embedding_request).param == "input"
    bad_format = {"model": "e", "input": "a", "encoding_format": "int8"}
    assert refused(bad_format, embedding_request).param == "encoding_format"


def llm(*inputs: Any, batched: bool = False) -> ModelMetadata:
    return ModelMetadata(
        "llm",
        ("1",),
        "python",
        (spec("text_input", "BYTES", [1, 1]), *inputs),
        (spec("text_output", "BYTES", [1, -1]),),
        8 if batched else 0,
        {"predict_stream": True},
    )


def test_only_the_inputs_a_model_declares_are_sent_in_their_shapes() -> None:
    metadata = llm(
        spec("stream", "BOOL", [1, 1]),
        spec("max_tokens", "INT32", [1], optional=True),
        spec("stop_words", "BYTES", [1, -1], optional=True),
        spec("sampling_parameters", "BYTES", [1], optional=True),
    )
    generation = completion_request({"model": "llm", "prompt": "p", "stop": ["a", "b"], "seed": 3})
    inputs = convention.generation_inputs(metadata, generation, "p", convention.Settings())
    assert set(inputs) == {
        "text_input",
        "stream",
        "max_tokens",
        "stop_words",
        "sampling_parameters",
    }
    assert inputs["text_input"].shape == (1, 1)
    assert inputs["max_tokens"].array().tolist() == [16]  # Triton's default
    assert inputs["stop_words"].shape == (1, 2)
    sampling = json.loads(inputs["sampling_parameters"].array()[0])
    assert sampling == {
        "frequency_penalty": 0.0,
        "n": 1,
        "presence_penalty": 0.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 16,
        "ignore_eos": False,
        "seed": 3,
        "stop": ["a", "b"],
    }
    # Batched: one row of the batch.
    batched = llm(spec("stream", "BOOL", [-1, 1]), batched=True)
    assert convention.generation_inputs(batched, generation, "p", convention.Settings())[
        "stream"
    ].shape == (1, 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 2**40}, "max_tokens"),  # past INT32
        ({"seed": -1}, "seed"),  # UINT64
        ({"seed": 2**70}, "seed"),
    ],
)
def test_a_value_past_the_model_s_type_is_refused_naming_the_input(
    body: dict[str, Any], param: str
) -> None:
    metadata = llm(
        spec("max_tokens", "INT32", [1, 1], optional=True),
        spec("seed", "UINT64", [1, 1], optional=True),
    )
    generation = completion_request({"model": "llm", "prompt": "p", **body})
    with pytest.raises(OpenAIError) as caught:
        convention.generation_inputs(metadata, generation, "p", convention.Settings())
    assert (caught.value.status, caught.value.param) == (400, param)


def test_a_required_input_the_routes_cannot_fill_refuses_the_model() -> None:
    metadata = llm(spec("lora_weights", "FP32", [-1]))
    generation = completion_request({"model": "llm", "prompt": "p"})
    with pytest.raises(OpenAIError, match="requires input lora_weights"):
        convention.generation_inputs(metadata, generation, "p", convention.Settings())


def test_which_models_make_embeddings() -> None:
    embeds = ModelMetadata(
        "e",
        ("1",),
        "python",
        (spec("input", "BYTES", [-1, 1]),),
        (spec("embedding", "FP32", [-1, 8]), spec("norm", "FP32", [-1, 1])),
        8,
    )
    form = convention.embedding_model(embeds)
    assert form is not None
    assert (form.text.name, form.vector.name) == ("input", "embedding")
    assert form.inputs("hello")["input"].shape == (1, 1)
    assert convention.embedding_model(llm()) is None


def cut(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    scan = StopScan(stops)
    out = ""
    for piece in pieces:
        out += scan.feed(piece)
        if scan.stopped:
            return out, True
    # A stop sequence may complete only with the end of the text (a longer one could have).
    out += scan.rest()
    return out, scan.stopped


@given(
    st.text(alphabet="abc", max_size=30),
    st.lists(st.text(alphabet="abc", min_size=1, max_size=3), max_size=3),
    st.lists(st.integers(min_value=0, max_value=30), max_size=6),
)
def test_stop_sequences_cut_the_same_however_the_text_arrives(
    text: str, stops: list[str], splits: list[int]
) -> None:
    bounds = sorted({0, len(text), *(min(s, len(text)) for s in splits)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    found = [text.find(stop) for stop in stops if stop in text]
    expected = (text[: min(found)], True) if found else (text, False)
    assert cut(stops, pieces) == expected


def test_the_longest_stop_sequences_cost_the_scan_little_per_piece() -> None:
    # Text that keeps matching every stop's beginning, a character a piece: each piece
    # looks through the held tail once per stop, never position by position.
    stops = ["a" * 255 + b for b in "bcde"]
    scan = StopScan(stops)
    out = "".join(scan.feed("a") for _ in range(20_000))
    assert out == "a" * (20_000 - 255)
    assert scan.feed("c") == ""
    assert scan.stopped


def test_a_chat_template_renders_as_transformers_renders_it(tmp_path: Path) -> None:
    config = {
        "eos_token": {"content": "</s>"},
        "chat_template": (
            "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}"
            "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
        ),
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    texts = Texts(tmp_path)
    assert texts.render(USER, "m") == "[user] hi</s>[assistant]"
    assert texts.count("hi") is None  # no tokenizer.json: no counts
    with pytest.raises(OpenAIError, match="no chat template"):
        Texts(None).render(USER, "m")


def test_where_a_tokenizer_is_found(tmp_path: Path) -> None:
    version = tmp_path / "model" / "1"
    version.mkdir(parents=True)
    options = {"path": str(version / "model.py")}
    assert tokenizer_dir(options, "", tmp_path / "model") is None
    assert tokenizer_dir(options, "/shared", tmp_path / "model") == Path("/shared")
    (tmp_path / "model" / "tokenizer").mkdir()
    assert tokenizer_dir(options, "/shared", tmp_path / "model") == tmp_path / "model" / "tokenizer"
    named = {**options, "tokenizer": "mine"}
    assert tokenizer_dir(named, "", tmp_path / "model") == tmp_path / "model" / "mine"
