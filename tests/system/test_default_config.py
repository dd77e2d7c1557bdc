"""What a new user meets with `make run`: the default config's models, every runtime.

One appliance serves appliance/default.toml's models, repositories and
GraphPipe root model, on ports 0; Triton's own example clients run against it
unmodified.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from graphpipe import remote

from tests.system import triton_examples
from tests.system.harness import (
    ROOT,
    Appliance,
    demo_models,
    make_config,
    new_run_dir,
    running,
    serving,
)

pytestmark = pytest.mark.filterwarnings("ignore:numElems is deprecated:DeprecationWarning")

DEFAULTS = tomllib.loads((ROOT / "appliance" / "default.toml").read_text())
HOLDOUT = ROOT / "tests" / "data" / "digits_holdout.npz"

# Every example client of Triton's folder but those that need a GPU (cudashm),
# an image model and pictures (image, grpc_image, ensemble_image, grpc_client),
# a fixed localhost:8000 (memory_growth_test: checked by hand against `make
# run`) or a repository of their own size (model_control: below).
EXAMPLES = [
    ("grpc_explicit_byte_content_client.py",),
    ("grpc_explicit_int8_content_client.py",),
    ("grpc_explicit_int_content_client.py",),
    ("reuse_infer_objects_client.py", "-i", "http"),
    ("reuse_infer_objects_client.py", "-i", "grpc"),
    ("simple_grpc_aio_infer_client.py",),
    ("simple_grpc_aio_sequence_stream_infer_client.py",),
    ("simple_grpc_async_infer_client.py",),
    ("simple_grpc_custom_args_client.py",),
    ("simple_grpc_custom_repeat.py",),
    ("simple_grpc_health_metadata.py",),
    ("simple_grpc_infer_client.py",),
    ("simple_grpc_keepalive_client.py",),
    ("simple_grpc_sequence_stream_infer_client.py",),
    ("simple_grpc_sequence_sync_infer_client.py",),
    ("simple_grpc_shm_client.py",),
    ("simple_grpc_shm_string_client.py",),
    ("simple_grpc_string_infer_client.py",),
    ("simple_http_aio_infer_client.py",),
    ("simple_http_async_infer_client.py",),
    ("simple_http_health_metadata.py",),
    ("simple_http_infer_client.py",),
    ("simple_http_sequence_sync_infer_client.py",),
    ("simple_http_shm_client.py",),
    ("simple_http_shm_string_client.py",),
    ("simple_http_string_infer_client.py",),
]
# The model-control examples check the size of the repository index against
# Triton's own test repository: 7 models (HTTP) and 8 (gRPC), "simple" among them.
CONTROL_MODELS = demo_models(
    "simple",
    "simple_int8",
    "simple_string",
    "simple_identity",
    "identity",
    "custom_identity_int32",
    "echo",
    "repeat_int32",
)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    run_dir = new_run_dir()
    config = make_config(
        run_dir,
        DEFAULTS["models"],
        server={"default_model": DEFAULTS["server"]["default_model"]},
        http={"graphpipe_model": DEFAULTS["http"]["graphpipe_model"]},
    )
    # Relative repository paths start at default.toml's directory.
    config["repositories"] = [
        {**repo, "path": str(ROOT / "appliance" / repo["path"])}
        for repo in DEFAULTS["repositories"]
    ]
    with serving(config) as started:
        yield started


def test_the_repository_index_lists_onnx_and_torchscript_models_ready(
    appliance: Appliance,
) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        platforms = {
            name: client.get_model_metadata(name)["platform"]
            for name in ("digits_onnx", "digits_torch")
        }
    finally:
        client.close()
    for name in ("digits_onnx", "digits_torch", "digits", "echo", "digits_ensemble"):
        assert index[name]["state"] == "READY", index[name]
    assert platforms == {"digits_onnx": "onnxruntime_onnx", "digits_torch": "pytorch_libtorch"}


def test_graphpipe_root_serves_a_model_with_declared_inputs_and_outputs(
    appliance: Appliance,
) -> None:
    root = f"http://127.0.0.1:{appliance.ports['http']}/"
    metadata: Any = remote.metadata(root)
    assert metadata.Name() == b"digits"
    assert remote.get_input_names(root) == ["pixels"]
    assert remote.get_output_names(root) == ["probabilities"]
    probabilities = remote.execute(root, np.zeros((3, 64), np.float32))
    assert probabilities.shape == (3, 10)
    # The status page is still there for a browser.
    page = requests.get(root, headers={"Accept": "text/html"}, timeout=10)
    assert page.status_code == 200


def test_the_demo_language_models_answer_the_openai_client(appliance: Appliance) -> None:
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{appliance.ports['http']}/v1", api_key="-", max_retries=0
    )
    assert {"tiny_gpt", "tiny_embed"} <= {model.id for model in client.models.list()}
    messages: Any = [{"role": "user", "content": "What does the model worker do?"}]
    chunks = list(
        client.chat.completions.create(
            model="tiny_gpt",
            messages=messages,
            max_tokens=12,
            stream=True,
            seed=5,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None
    assert 0 < usage.completion_tokens <= 12
    # Seeded: the same text again, whole.
    again = client.chat.completions.create(
        model="tiny_gpt", messages=messages, max_tokens=12, seed=5
    )
    assert again.choices[0].message.content == text
    vectors = client.embeddings.create(
        model="tiny_embed", input=["shared memory rings", "shared memory", "a gRPC port"]
    )
    near, far = (
        float(np.dot(vectors.data[0].embedding, vectors.data[i].embedding)) for i in (1, 2)
    )
    assert len(vectors.data[0].embedding) == 64
    assert near > far


def test_digits_ensemble_answers_the_labels_of_digits_and_argmax_on_the_holdout(
    appliance: Appliance,
) -> None:
    """Raw UINT8 images in, the label out, over KServe REST and gRPC, GraphPipe and GRPS."""
    with np.load(HOLDOUT) as data:
        images = data["X"].astype(np.uint8).reshape(-1, 8, 8)
    batches = [images[start : start + 64] for start in range(0, len(images), 64)]
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    http = f"http://127.0.0.1:{appliance.ports['http']}"
    answers: dict[str, list[str]] = {name: [] for name in ("rest", "grpc", "graphpipe", "grps")}
    expected: list[str] = []
    try:
        for batch in batches:
            pixels = httpclient.InferInput("pixels", [len(batch), 64], "FP32")
            pixels.set_data_from_numpy(batch.reshape(-1, 64).astype(np.float32))
            probabilities = rest.infer("digits", [pixels]).as_numpy("probabilities")
            expected += [str(label) for label in probabilities.argmax(axis=1)]
            for name, module, client in (("rest", httpclient, rest), ("grpc", grpcclient, grpc)):
                image = module.InferInput("IMAGE", list(batch.shape), "UINT8")
                image.set_data_from_numpy(batch)
                labels = client.infer("digits_ensemble", [image]).as_numpy("LABEL")
                answers[name] += [label.decode() for label in labels.ravel()]
            labels = remote.execute(f"{http}/graphpipe/digits_ensemble", batch)
            answers["graphpipe"] += [label.decode() for label in np.asarray(labels).ravel()]
            tensor = {"name": "IMAGE", "dtype": "DT_UINT8", "shape": list(batch.shape)}
            body = {"model": "digits_ensemble", "gtensors": {"tensors": [tensor]}}
            tensor["flat_uint8"] = batch.ravel().tolist()
            reply = requests.post(f"{http}/grps/v1/infer/predict", json=body, timeout=30)
            answers["grps"] += reply.json()["gtensors"]["tensors"][0]["flat_string"]
    finally:
        rest.close()
        grpc.close()
    assert len(expected) == len(images) == 360
    for protocol, labels in answers.items():
        assert labels == expected, protocol


def transport(example: str, args: tuple[str, ...]) -> str:
    return "grpc" if "grpc" in example or "grpc" in args else "http"


@triton_examples.needs_examples
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: " ".join(e))
def test_triton_example_client_passes_unmodified(
    example: tuple[str, ...], appliance: Appliance, tmp_path: Path
) -> None:
    name, *args = example
    url = f"127.0.0.1:{appliance.ports[transport(name, tuple(args))]}"
    done = triton_examples.run(name, url, tmp_path, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "error" not in done.stdout.lower(), done.stdout


@triton_examples.needs_examples
@pytest.mark.parametrize(
    ("example", "models"),
    [("simple_http_model_control.py", 7), ("simple_grpc_model_control.py", 8)],
)
def test_triton_model_control_example_passes_against_a_repository_of_its_size(
    example: str, models: int, tmp_path: Path
) -> None:
    with running(CONTROL_MODELS[:models]) as appliance:
        url = f"127.0.0.1:{appliance.ports[transport(example, ())]}"
        done = triton_examples.run(example, url, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: model control" in done.stdout
