"""What the zygote may import, and how a model's response ring is sized."""

from __future__ import annotations

import subprocess
import sys

import pytest

from appliance.config.settings import ModelConfig, ShmConfig
from appliance.core.metadata import ModelMetadata
from appliance.model import spec
from appliance.worker.main import RING_BATCHES, RING_FLOOR_BYTES, response_ring_bytes

MiB = 1 << 20
SHM = ShmConfig(response_ring_bytes=32 * MiB)


def test_the_zygote_imports_no_model_runtime_or_frontend() -> None:
    # A fresh interpreter: what importing the zygote's module pulls in, and no threads.
    code = (
        "import sys, threading, appliance.zygote\n"
        "print(threading.active_count())\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert out[0] == "1"
    modules = set(out[1:])
    assert {"numpy", "zmq", "appliance.worker.server", "prometheus_client"} <= modules
    # A reload must load a changed model file, and a model's runtime (or CUDA)
    # must never be initialised before a fork; gRPC does not survive one.
    forbidden = ("torch", "onnxruntime", "grpc", "appliance.demos", "appliance.frontends")
    assert not [m for m in modules if m.split(".")[0] in forbidden or m.startswith(forbidden)]
    assert not [
        m
        for m in modules
        if m.startswith("appliance.runtimes.") and m != ("appliance.runtimes.interface")
    ]


def metadata(outputs: list[object] | None, max_batch: int, **supports: bool) -> ModelMetadata:
    return ModelMetadata(
        name="m",
        versions=("1",),
        platform="python",
        inputs=(spec("x", "FP32", [-1, 1000]),) if max_batch else (spec("x", "FP32", [1000]),),
        outputs=None if outputs is None else tuple(outputs),  # type: ignore[arg-type]
        max_batch_size=max_batch,
        supports=supports,
    )


def model(ring: int | None = None) -> ModelConfig:
    return ModelConfig(name="m", cls="x:Y", response_ring_bytes=ring)


@pytest.mark.parametrize(
    ("outputs", "max_batch", "expected"),
    [
        # simple: two INT32 [-1, 16] outputs, batches of 8: tiny, so the floor.
        ([spec("a", "INT32", [-1, 16]), spec("b", "INT32", [-1, 16])], 8, RING_FLOOR_BYTES),
        # 64 batches of 16 rows of 8 KiB each: 8 MiB.
        ([spec("a", "FP32", [-1, 2048])], 16, 64 * 16 * 8192),
        # Larger than the configured ring: never more than it.
        ([spec("a", "FP32", [-1, 1 << 20])], 64, 32 * MiB),
        # Unbounded: a free dimension past the batch's, BYTES, or no declaration.
        ([spec("a", "FP32", [-1, -1])], 8, 32 * MiB),
        ([spec("a", "BYTES", [-1, 4])], 8, 32 * MiB),
        ([spec("a", "FP32", [-1, 4])], 0, 32 * MiB),
        (None, 8, 32 * MiB),
        # No batch dimension: one fixed output, 64 times (aligned to 64 bytes).
        ([spec("a", "FP64", [10000])], 0, RING_BATCHES * 80000),
    ],
)
def test_a_response_ring_is_sized_from_the_declared_outputs(
    outputs: list[object] | None, max_batch: int, expected: int
) -> None:
    assert response_ring_bytes(metadata(outputs, max_batch), model(), SHM) == expected


def test_the_models_own_ring_size_wins() -> None:
    outputs = [spec("a", "INT32", [-1, 16])]
    assert response_ring_bytes(metadata(outputs, 8), model(3 * MiB), SHM) == 3 * MiB
    assert response_ring_bytes(metadata(outputs, 8), model(64 * MiB), SHM) == 64 * MiB


def test_a_model_with_derivatives_counts_its_inputs_which_a_gradient_mirrors() -> None:
    outputs = [spec("a", "FP32", [1])]
    plain = response_ring_bytes(metadata(outputs, 0), model(), SHM)
    with_gradient = metadata(outputs, 0, gradient=True)
    assert plain == RING_FLOOR_BYTES
    # One output of 4 bytes (64 aligned) and the input of 4000 bytes (4032 aligned).
    assert response_ring_bytes(with_gradient, model(), SHM) == RING_FLOOR_BYTES
    big = ModelMetadata(
        "m",
        ("1",),
        "python",
        (spec("x", "FP64", [1 << 13]),),
        tuple(outputs),
        0,
        {"gradient": True},
    )
    assert response_ring_bytes(big, model(), SHM) == RING_BATCHES * ((8 << 13) + 64)
