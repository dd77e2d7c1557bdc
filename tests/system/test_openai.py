"""OpenAI's routes driven by the ``openai`` client, unmodified, and by raw HTTP for what it hides.

The models are written for Triton's OpenAI frontend (tests/data/openai_models):
a decoupled word generator with a tokenizer directory (its chat template)
and an embedding model batched by the dynamic batcher.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import orjson
import pytest
import requests

from tests.system.harness import (
    ROOT,
    Appliance,
    copied_repository,
    eventually,
    serving_repository,
)

MODELS = ROOT / "tests" / "data" / "openai_models"


@pytest.fixture(scope="module")
def repository() -> Iterator[Path]:
    with copied_repository(MODELS, "openai-") as root:
        yield root


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    with serving_repository(repository) as started:
        yield started


@pytest.fixture
def client(appliance: Appliance) -> openai.OpenAI:
    base = f"http://127.0.0.1:{appliance.ports['http']}/v1"
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=30)


def url(appliance: Appliance, path: str) -> str:
    return f"http://127.0.0.1:{appliance.ports['http']}/v1{path}"


def post(appliance: Appliance, path: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(url(appliance, path), data=orjson.dumps(body), timeout=30, **kwargs)


def events(response: requests.Response) -> list[bytes]:
    """Each ``data:`` event's payload, as an SSE client splits them."""
    return [
        event.removeprefix(b"data: ")
        for event in response.content.split(b"\n\n")
        if event.startswith(b"data: ")
    ]


# -- chat -------------------------------------------------------------------------


def test_chat_renders_the_template_and_answers(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="tiny_llm",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=4,
    )
    choice = answer.choices[0]
    # The template (tokenizer/tokenizer_config.json) makes "<s>user: hello there\nassistant:",
    # whose words the model answers.
    assert choice.message.content == "<s>user: hello there assistant:"
    assert choice.message.role == "assistant"
    assert answer.object == "chat.completion"
    assert answer.id.startswith("chatcmpl-")
    assert answer.model == "tiny_llm"
    # The model's own counts: 4 words in, 4 tokens out, which is max_tokens.
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 4)
    assert answer.usage.total_tokens == 8
    assert choice.finish_reason == "length"


def test_chat_streams_a_chunk_per_response(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny_llm",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == "<s>system: be brief user: hi"
    assert len(texts) == 5  # a delta per token
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "length"
    assert all(reason is None for reason in finish[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert {c.id for c in chunks} == {chunks[0].id}


def test_the_settings_reach_the_model_as_triton_sends_them(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model="tiny_llm",
        prompt="settings",
        max_tokens=7,
        temperature=0.25,
        top_p=0.5,
        seed=42,
        stop=["ab", "cd"],
    )
    sent = orjson.loads(answer.choices[0].text)
    # (The model reverses the strings it was sent.)
    assert sent["text_input"] == ["object", [1, 1], ["sgnittes"]]
    assert sent["stream"] == ["bool", [1, 1], [False]]
    assert sent["max_tokens"] == ["int32", [1, 1], [7]]
    assert sent["temperature"] == ["float32", [1, 1], [0.25]]
    assert sent["top_p"] == ["float32", [1, 1], [0.5]]
    assert sent["seed"] == ["uint64", [1, 1], [42]]
    assert sent["stop_words"] == ["object", [1, 2], ["ba", "dc"]]
    assert sent["frequency_penalty"][2] == [0.0]
    assert sent["return_num_output_tokens"][2] == [True]


def test_stop_sequences_end_the_text_even_where_the_model_ignores_them(
    client: openai.OpenAI,
) -> None:
    answer = client.completions.create(
        model="tiny_llm", prompt="the quick brown fox", max_tokens=12, stop="brown"
    )
    assert answer.choices[0].text == "the quick "
    assert answer.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny_llm", prompt="the quick brown fox", max_tokens=12, stop=[" fox"], stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "the quick brown"


def test_a_completion_with_echo_starts_with_its_prompt(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="tiny_llm", prompt="a b", max_tokens=2, echo=True)
    assert answer.choices[0].text == "a ba b"
    assert answer.object == "text_completion"


# -- embeddings -----------------------------------------------------------------------


def test_embeddings_in_both_encodings_batched(appliance: Appliance, client: openai.OpenAI) -> None:
    texts = [f"text number {n} with vowels" for n in range(12)]
    # The client asks for base64 unless told otherwise, and decodes it.
    answer = client.embeddings.create(model="tiny_embed", input=texts)
    vectors = [item.embedding for item in answer.data]
    assert [item.index for item in answer.data] == list(range(12))
    for text, vector in zip(texts, vectors, strict=True):
        assert vector[:3] == [len(text), sum(c in "aeiou" for c in text), len(text.split())]
    # Twelve requests at once: the dynamic batcher ran some together.
    assert max(vector[3] for vector in vectors) > 1
    # As many texts as OpenAI allows in one request: more than the model's queue holds.
    many = client.embeddings.create(model="tiny_embed", input=[f"t{n}" for n in range(2048)])
    assert [item.embedding[0] for item in many.data] == [len(f"t{n}") for n in range(2048)]
    floats = client.embeddings.create(model="tiny_embed", input="hi", encoding_format="float")
    assert floats.data[0].embedding[:3] == [2, 1, 1]
    body = {"model": "tiny_embed", "input": "hi", "encoding_format": "base64"}
    raw = post(appliance, "/embeddings", body)
    packed = raw.json()["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(packed), "<f4")[:3].tolist() == [2, 1, 1]


# -- models and errors ----------------------------------------------------------------------


def test_models_lists_what_is_served(client: openai.OpenAI) -> None:
    names = {model.id for model in client.models.list()}
    assert {"tiny_llm", "tiny_embed"} <= names
    one = client.models.retrieve("tiny_embed")
    assert (one.id, one.object, one.owned_by) == ("tiny_embed", "model", "appliance")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("nonesuch")
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_errors_are_openai_error_objects(appliance: Appliance, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="nonesuch", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="tiny_llm", messages=[{"role": "user", "content": "x"}], n=2
        )
    assert caught.value.body["param"] == "n"  # type: ignore[index]
    bad = post(appliance, "/completions", {"model": "tiny_llm", "prompt": "x", "temperature": 3})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == ("invalid_request_error", "temperature")
    huge = post(
        appliance, "/completions", {"model": "tiny_llm", "prompt": "x", "max_tokens": 2**63}
    )
    assert (huge.status_code, huge.json()["error"]["param"]) == (400, "max_tokens")
    unknown = post(appliance, "/completions", {"model": "tiny_llm", "prompt": "x", "frob": 1})
    assert unknown.json()["error"]["param"] == "frob"
    not_json = requests.post(url(appliance, "/chat/completions"), data=b"{", timeout=30)
    assert not_json.status_code == 400
    assert "not valid JSON" in not_json.json()["error"]["message"]
    # A model that makes no text, and one that makes no vectors, say so by name.
    no_text = post(appliance, "/completions", {"model": "tiny_embed", "prompt": "x"})
    assert no_text.status_code == 400
    assert "generates no text" in no_text.json()["error"]["message"]
    no_vectors = post(appliance, "/embeddings", {"model": "tiny_llm", "input": "x"})
    assert "makes no embeddings" in no_vectors.json()["error"]["message"]
    # A template that refuses the messages: the template's words.
    refused = post(
        appliance,
        "/chat/completions",
        {"model": "tiny_llm", "messages": [{"role": "tool", "content": "x"}]},
    )
    assert refused.status_code == 400
    assert "no tools here" in refused.json()["error"]["message"]


def test_sse_framing_and_an_error_mid_stream(appliance: Appliance, client: openai.OpenAI) -> None:
    body = {"model": "tiny_llm", "prompt": "one two", "max_tokens": 2, "stream": True}
    response = post(appliance, "/completions", body)
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = events(response)
    assert payloads[-1] == b"[DONE]"
    assert [orjson.loads(p)["choices"][0]["text"] for p in payloads[:-1]] == ["one", " two", ""]
    # The model fails after two tokens: the stream's last event is the error object.
    failing = {"model": "tiny_llm", "prompt": "fail now", "max_tokens": 5, "stream": True}
    got = events(post(appliance, "/completions", failing))
    assert b"[DONE]" not in got
    assert "failed on purpose" in orjson.loads(got[-1])["error"]["message"]
    stream = client.completions.create(
        model="tiny_llm", prompt="fail now", max_tokens=5, stream=True
    )
    with pytest.raises(openai.APIError, match="failed on purpose"):
        list(stream)


def test_a_client_that_goes_away_stops_its_generation(
    appliance: Appliance, repository: Path
) -> None:
    log = repository / "tiny_llm" / "1" / "generated.log"
    body = {"model": "tiny_llm", "prompt": "slow words", "max_tokens": 200, "stream": True}
    with post(appliance, "/completions", body, stream=True) as response:
        lines = response.iter_lines()
        got = [next(lines) for _ in range(3)]
        assert any(line.startswith(b"data: ") for line in got)
    # 200 tokens at 50 ms would take 10 s: the generation ends well before.
    assert eventually(lambda: log.exists() and log.read_text().strip() != "", timeout_s=8)
    sent, cancelled = log.read_text().split()
    assert cancelled == "True"
    assert int(sent) < 100
    time.sleep(0)  # the appliance goes on serving
    assert post(appliance, "/completions", {"model": "tiny_llm", "prompt": "x"}).status_code == 200


def test_metrics_count_the_routes_and_time_the_first_token(
    appliance: Appliance, client: openai.OpenAI
) -> None:
    list(client.completions.create(model="tiny_llm", prompt="a b c", max_tokens=3, stream=True))
    http = appliance.ports["http"]

    def samples() -> dict[str, float]:
        text = requests.get(f"http://127.0.0.1:{http}/metrics", timeout=10).text
        found = {}
        for line in text.splitlines():
            if line.startswith("appliance_") and 'protocol="openai"' in line:
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        return found

    first = 'appliance_stream_first_response_seconds_count{model="tiny_llm",protocol="openai"}'
    tokens = 'appliance_stream_responses_total{model="tiny_llm",protocol="openai"}'
    assert eventually(lambda: samples().get(first, 0) >= 1, timeout_s=10)
    got = samples()
    assert got[tokens] >= 3
    answered = [v for k, v in got.items() if k.startswith("appliance_frontend_requests_total")]
    assert sum(answered) >= 1


def test_a_client_that_stops_reading_holds_back_no_other(appliance: Appliance) -> None:
    body = orjson.dumps(
        {"model": "tiny_llm", "prompt": "many words to repeat", "max_tokens": 5000, "stream": True}
    )
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", appliance.ports["http"]), timeout=30) as stuck:
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(head.encode() + body)
        assert stuck.recv(64).startswith(b"HTTP/1.1 200")
        # It reads no more; its stream fills the socket's buffers and waits.
        started = time.monotonic()
        other = post(appliance, "/completions", {"model": "tiny_llm", "prompt": "x y"})
        assert other.status_code == 200
        assert other.json()["choices"][0]["text"] == "x y x y x y x y x y x y x y x y"
        assert time.monotonic() - started < 10
