"""Requests with more rows than max_batch_size are served whole, on every protocol."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from appliance.client.api import ModelClient
from appliance.core.status import Counter
from appliance.errors import DeadlineExceeded
from tests.system.harness import Appliance, demo_models, eventually, running

HOLDOUT = Path(__file__).resolve().parent.parent / "data" / "digits_holdout.npz"
# docs/demo-models.md: digits classifies 349 of the 360 held-out rows correctly.
CORRECT = 349
# The whole scikit-learn digits set has this many rows (the example).
FULL_SET_ROWS = 1797
MODELS = [
    *demo_models("digits"),
    {"name": "probe", "class": "tests.models:BatchProbe", "max_queue_delay_ms": 0.0},
    {"name": "short_queue", "class": "tests.models:BatchProbe", "max_queue": 4},
    {"name": "slow_probe", "class": "tests.models:BatchProbe", "options": {"delay_s": 0.05}},
]


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    with running(MODELS) as started:
        yield started


@pytest.fixture(scope="module")
def holdout() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    with np.load(HOLDOUT) as data:
        return data["X"].astype(np.float32), data["y"].astype(np.int64)


def rest_infer(
    appliance: Appliance, model: str, name: str, x: np.ndarray
) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        value = httpclient.InferInput(name, list(x.shape), "FP32")
        value.set_data_from_numpy(x)
        return client.infer(model, [value])
    finally:
        client.close()


def grpc_infer(
    appliance: Appliance, model: str, name: str, x: np.ndarray
) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        value = grpcclient.InferInput(name, list(x.shape), "FP32")
        value.set_data_from_numpy(x)
        return client.infer(model, [value], client_timeout=60)
    finally:
        client.close()


def delta(client: ModelClient, model: str, before: dict[Counter, int], counter: Counter) -> int:
    return client.counters(model)[counter] - before[counter]


@pytest.mark.parametrize("infer", [rest_infer, grpc_infer], ids=["rest", "grpc"])
def test_the_held_out_digits_classify_in_one_kserve_request(
    appliance: Appliance,
    holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]],
    infer: object,
) -> None:
    pixels, labels = holdout
    assert len(pixels) > 64  # digits' max_batch_size
    result = infer(appliance, "digits", "pixels", pixels)  # type: ignore[operator]
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (len(labels), 10)
    assert int(np.sum(probabilities.argmax(axis=1) == labels)) == CORRECT
    # As many rows as the whole digits set: the rows come back in request order.
    rows = np.resize(pixels, (FULL_SET_ROWS, 64))
    full = infer(appliance, "digits", "pixels", rows).as_numpy("probabilities")  # type: ignore[operator]
    assert full.shape == (FULL_SET_ROWS, 10)
    assert np.allclose(full, np.resize(probabilities, (FULL_SET_ROWS, 10)), atol=1e-6)


def test_the_model_never_sees_more_rows_than_max_batch_size(appliance: Appliance) -> None:
    before = appliance.client().counters("probe")
    x = np.arange(100 * 4, dtype=np.float32).reshape(100, 4)
    result = rest_infer(appliance, "probe", "x", x)
    assert np.array_equal(result.as_numpy("y"), 2 * x)
    assert result.as_numpy("batch").max() <= 16  # BatchProbe's max_batch_size
    # One request, answered once, in 7 batches (workers publish counters a moment later).
    client = appliance.client()
    assert eventually(lambda: delta(client, "probe", before, Counter.BATCH_ROWS) == 100, 10.0)
    assert delta(client, "probe", before, Counter.SUCCESS) == 1
    assert delta(client, "probe", before, Counter.BATCHES) == 7


def test_a_deadline_that_passes_between_pieces_fails_the_request_once(
    appliance: Appliance,
) -> None:
    client = appliance.client()
    before = client.counters("slow_probe")
    x = np.ones((16 * 10, 4), dtype=np.float32)  # 10 batches of 50 ms each
    with pytest.raises(DeadlineExceeded):
        client.infer("slow_probe", {"x": x}, timeout_s=0.12)
    # The pieces still queued are dropped, and the model serves the next request.
    with client.infer("slow_probe", {"x": x[:20]}, timeout_s=30) as result:
        assert np.array_equal(result.array("y"), 2 * x[:20])
    assert eventually(lambda: delta(client, "slow_probe", before, Counter.SUCCESS) == 1, 10.0)
    assert delta(client, "slow_probe", before, Counter.FAIL) == 1
    # At most 3 pieces start within 0.12 s; then the 2 batches of the 20 rows.
    assert delta(client, "slow_probe", before, Counter.BATCHES) <= 5


def test_grps_serves_the_held_out_set_in_one_request(
    appliance: Appliance, holdout: tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]
) -> None:
    pixels, labels = holdout
    response = requests.post(
        f"http://127.0.0.1:{appliance.ports['http']}/grps/v1/infer/predict"
        "?model=digits&return-ndarray=true",
        json={"ndarray": pixels.tolist()},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    predicted = np.array(response.json()["ndarray"]).argmax(axis=1)
    assert int(np.sum(predicted == labels)) == CORRECT


def test_a_request_needing_more_batches_than_max_queue_is_overloaded(
    appliance: Appliance,
) -> None:
    x = np.zeros((16 * 5, 4), dtype=np.float32)  # 5 batches; the queue holds 4
    with pytest.raises(InferenceServerException) as rest:
        rest_infer(appliance, "short_queue", "x", x)
    assert rest.value.status() == "429"
    assert "max_queue" in str(rest.value.message())
    with pytest.raises(InferenceServerException) as grpc:
        grpc_infer(appliance, "short_queue", "x", x)
    assert grpc.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    # Four batches fit.
    fits = rest_infer(appliance, "short_queue", "x", x[: 16 * 4])
    assert fits.as_numpy("y").shape == (64, 4)
