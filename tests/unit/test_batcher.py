"""Batch formation and output splitting, without processes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from appliance.core.descriptor import Kind, Message
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, spec
from appliance.errors import BadRequest, ModelFailed
from appliance.worker.batcher import Batcher, batch_inputs, check_request, split_outputs
from appliance.worker.pieces import answered, cut

META = ModelMetadata(
    "m",
    ("1",),
    "python",
    (spec("x", "FP32", [-1, 2]),),
    (spec("y", "FP32", [-1, 2]),),
    max_batch_size=4,
)


def pending(rows: int, params: dict[str, object] | None = None, request_id: int = 1):  # type: ignore[no-untyped-def]
    x = np.full((rows, 2), request_id, dtype=np.float32)
    body = {"method": "predict", "params": params or {}}
    message = Message(Kind.INFER, request_id, 1, body)
    return check_request(META, message, {"x": Tensor.from_array(x)})


def test_compatible_requests_batch_up_to_the_limit() -> None:
    batcher = Batcher(4, max_queue_delay_s=10.0)
    for request_id, rows in enumerate([1, 2, 1, 3], start=1):
        batcher.add(pending(rows, request_id=request_id))
    now = batcher.queue[0].arrived
    batch = batcher.take(now)
    assert [p.request_id for p in batch] == [1, 2, 3]
    assert batch_inputs(batch)["x"].shape == (4, 2)
    assert batcher.take(now) == []  # 3 rows < 4 and the delay has not passed
    assert [p.request_id for p in batcher.take(now + 11.0)] == [4]


def test_different_parameters_never_share_a_batch() -> None:
    batcher = Batcher(4, max_queue_delay_s=0.0)
    batcher.add(pending(1, {"a": 1}, 1))
    batcher.add(pending(1, {"a": 2}, 2))
    batcher.add(pending(1, {"a": 1}, 3))
    now = time.monotonic()
    assert [p.request_id for p in batcher.take(now)] == [1, 3]
    assert [p.request_id for p in batcher.take(now)] == [2]


def test_outputs_are_split_back_by_rows() -> None:
    batch = [pending(1, request_id=1), pending(2, request_id=2)]
    inputs = batch_inputs(batch)
    results = split_outputs(META, {"y": inputs["x"] * 10}, batch)
    assert results[0]["y"].array().tolist() == [[10.0, 10.0]]
    assert results[1]["y"].array().tolist() == [[20.0, 20.0], [20.0, 20.0]]


def test_a_model_returning_the_wrong_rows_fails_the_batch() -> None:
    batch = [pending(1, request_id=1), pending(2, request_id=2)]
    with pytest.raises(ModelFailed, match="expected 3 rows"):
        split_outputs(META, {"y": np.zeros((2, 2), np.float32)}, batch)
    with pytest.raises(ModelFailed, match="did not return its output y"):
        split_outputs(META, {}, batch)


def test_a_prediction_over_max_batch_size_is_cut_into_views_and_joined_in_order() -> None:
    whole = pending(10)
    whole.arrays["x"] = np.arange(20, dtype=np.float32).reshape(10, 2)
    pieces = cut(whole, 4)
    assert [p.rows for p in pieces] == [4, 4, 2]
    assert all(np.shares_memory(p.arrays["x"], whole.arrays["x"]) for p in pieces)
    batcher = Batcher(4, max_queue_delay_s=0.0)
    for piece in pieces:
        batcher.add(piece)
    now = time.monotonic()
    batches = [batcher.take(now) for _ in pieces]
    assert [len(batch) for batch in batches] == [1, 1, 1]  # full pieces never share a batch
    joined = None
    # Answered out of order on purpose: the join follows the request's rows.
    for batch in reversed(batches):
        outputs = split_outputs(META, {"y": batch_inputs(batch)["x"] * 10}, batch)
        assert joined is None
        joined = answered(batch[0], outputs[0])
    assert joined is not None
    assert joined["y"].array().tolist() == (np.arange(20).reshape(10, 2) * 10).tolist()


def test_streams_and_derivatives_over_max_batch_size_are_refused() -> None:
    x = Tensor.from_array(np.zeros((5, 2), dtype=np.float32))
    for method in ("stream", "gradient"):
        message = Message(Kind.INFER, 1, 1, {"method": method})
        with pytest.raises(BadRequest, match="exceeds its max_batch_size of 4"):
            check_request(META, message, {"x": x})
