"""Sequence admission, batches of steps and implicit state, without processes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from appliance.core.descriptor import Kind, Message
from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.sequences import Control, State, state
from appliance.core.tensor import Tensor, spec
from appliance.errors import BadRequest, Overloaded
from appliance.worker.batcher import batch_inputs, check_request
from appliance.worker.pending import Pending
from appliance.worker.sequence_batcher import SequenceBatcher
from appliance.worker.sequence_settings import SequenceSettings
from appliance.worker.sequences import Sequences, batcher_for, refuse_sequence

META = ModelMetadata(
    "m", ("1",), "python", (spec("x", "INT32", [-1, 1]),), (spec("y", "INT32", [-1, 1]),), 4
)
CONTROLS = {"S": "start", "E": "end", "R": "ready", "C": "corrid"}


def settings(strategy: str = "oldest", candidates: int = 8, batch: int = 4) -> SequenceSettings:
    return SequenceSettings(
        "m", strategy, 60.0, candidates, batch, (state("IN", "OUT", "INT32", [1]),), CONTROLS
    )


def step(value: int, number: int = 1, **params: Any) -> Pending:
    body = {"method": "predict", "params": params}
    message = Message(Kind.INFER, number, 1, body)
    x = np.full((1, 1), value, dtype=np.int32)
    return check_request(META, message, {"x": Tensor.from_array(x)})


def test_sequence_parameters_are_kept_apart_from_the_model_parameters() -> None:
    pending = step(1, sequence_id=7, sequence_start=True, scale=2)
    assert pending.parameters == {"scale": 2}
    assert pending.sequence == {"sequence_id": 7, "sequence_start": True}
    # Steps of different sequences may share a batch.
    assert step(1, sequence_id=8).key == step(1, sequence_id=9).key
    with pytest.raises(BadRequest, match="does not serve stateful sequences"):
        refuse_sequence("m", pending)
    refuse_sequence("m", step(1, scale=2))


def test_admission_refuses_unknown_second_starts_and_missing_ids() -> None:
    sequences = Sequences(settings())
    with pytest.raises(BadRequest, match="no live sequence 7"):
        sequences.admit(step(1, sequence_id=7), 0.0)
    sequences.admit(step(1, sequence_id=7, sequence_start=True), 0.0)
    with pytest.raises(BadRequest, match="sequence 7 is already live"):
        sequences.admit(step(1, sequence_id=7, sequence_start=True), 0.0)
    for bad in (0, "", None, True, 1.5):
        with pytest.raises(BadRequest, match="needs a sequence_id"):
            sequences.admit(step(1, sequence_id=bad), 0.0)
    sequences.admit(step(1, sequence_id=7, sequence_end=True), 0.0)
    with pytest.raises(BadRequest, match="no live sequence 7"):
        sequences.admit(step(1, sequence_id=7), 0.0)


def test_live_sequences_are_limited_per_strategy() -> None:
    oldest = Sequences(settings(candidates=2))
    for sequence_id in (1, 2):
        oldest.admit(step(1, sequence_id=sequence_id, sequence_start=True), 0.0)
    with pytest.raises(Overloaded, match="max_candidate_sequences\\) is 2"):
        oldest.admit(step(1, sequence_id=3, sequence_start=True), 0.0)
    # "direct": past its slots a start waits, up to max_candidate_sequences of them.
    direct = Sequences(settings("direct", candidates=1, batch=2))
    for sequence_id in (1, 2, 3):
        direct.admit(step(1, sequence_id=sequence_id, sequence_start=True), 0.0)
    assert [live.id for live in direct.waiting] == [3]
    with pytest.raises(Overloaded, match=r"all 2 sequence slots .* 1 sequences already wait"):
        direct.admit(step(1, sequence_id=4, sequence_start=True), 0.0)
    direct.admit(step(1, sequence_id=1, sequence_end=True), 0.0)
    assert (direct.live[3].slot, direct.live[3].waiting) == (0, False)
    direct.admit(step(1, sequence_id=4, sequence_start=True), 0.0)


def test_a_direct_sequence_past_the_slots_runs_once_a_slot_frees() -> None:
    sequences = Sequences(settings("direct", batch=1))
    batcher = batcher_for(1, 0.0, sequences)
    first = step(1, 1, sequence_id="a", sequence_start=True)
    waiting = [
        step(2, 2, sequence_id="b", sequence_start=True),
        step(3, 3, sequence_id="b"),
        step(4, 4, sequence_id="b", sequence_end=True),
    ]
    for pending in (first, *waiting):
        sequences.admit(pending, 0.0)
        batcher.add(pending)
    # Held steps count as queued, and no batch of them is due yet.
    assert len(batcher) == 4
    assert batcher.take(0.0) == [first]
    assert batcher.take(0.0) == []
    assert batcher.wait_s(0.0) is None
    # "b" waiting is not idle.
    assert sequences.expire(1000.0) == ["a"]
    # Expiring "a" freed its slot: "b" took it, its steps run in order, one per batch.
    assert [batcher.take(0.0) for _ in range(3)] == [[pending] for pending in waiting]
    assert len(batcher) == 0
    # "b" ended while it waited: its slot is free for the next sequence.
    sequences.admit(step(5, 5, sequence_id="c", sequence_start=True), 0.0)
    assert (sequences.live["c"].slot, sequences.live["c"].waiting) == (0, False)


def test_idle_sequences_expire() -> None:
    sequences = Sequences(settings())
    sequences.admit(step(1, sequence_id="a", sequence_start=True), 0.0)
    sequences.admit(step(1, sequence_id="b", sequence_start=True), 0.0)
    sequences.admit(step(1, sequence_id="b"), 50.0)
    assert sequences.expire(61.0) == ["a"]
    assert list(sequences.live) == ["b"]


@pytest.mark.parametrize("strategy", ["oldest", "direct"])
def test_a_batch_holds_one_step_per_sequence_and_state_carries_over(strategy: str) -> None:
    sequences = Sequences(settings(strategy))
    batcher = SequenceBatcher(4, 0.0, strategy == "direct")
    queued = [
        step(10, 1, sequence_id=1, sequence_start=True),
        step(20, 2, sequence_id="2", sequence_start=True),
        step(11, 3, sequence_id=1),
        step(21, 4, sequence_id="2", sequence_end=True),
        step(12, 5, sequence_id=1, sequence_end=True),
    ]
    for pending in queued:
        sequences.admit(pending, 0.0)
        batcher.add(pending)
    outputs = []
    while batch := batcher.take(time.monotonic()):
        assert len({id(p.step.live) for p in batch if p.step}) == len(batch)
        inputs = sequences.inputs(batch, batch_inputs(batch))
        running = inputs["IN"] + inputs["x"]
        kept = sequences.keep(batch, {"y": running + inputs["E"] * 0, "OUT": running})
        assert "OUT" not in kept
        outputs.append((inputs, [p.request_id for p in batch], kept["y"][:, 0].tolist()))
    first_inputs, first_ids, first_sums = outputs[0]
    assert first_ids == [1, 2]
    assert first_sums == [10, 20]
    assert first_inputs["S"].tolist() == [[1], [1]]
    assert first_inputs["C"].tolist() == [[b"1"], [b"2"]]  # a string id makes them all BYTES
    assert [ids for _i, ids, _s in outputs[1:]] == [[3, 4], [5]]
    assert [sums for _i, _ids, sums in outputs[1:]] == [[21, 41], [33]]
    assert outputs[1][0]["E"].tolist() == [[0], [1]]
    assert sequences.live == {}


def test_typed_controls_take_their_declared_types_and_values() -> None:
    typed = {
        "S": Control("start", DType.FP32, 0.0, 1.0),
        "E": Control("end", DType.BOOL, False, True),
        "R": Control("ready", DType.INT32, -1, 7),
        "C": Control("corrid", DType.UINT64),
    }
    sequences = Sequences(SequenceSettings("m", "oldest", 60.0, 8, 4, (), typed))
    batch = [
        step(1, 1, sequence_id=5, sequence_start=True),
        step(2, 2, sequence_id=6, sequence_start=True, sequence_end=True),
    ]
    for pending in batch:
        sequences.admit(pending, 0.0)
    inputs = sequences.inputs(batch, batch_inputs(batch))
    assert (inputs["S"].dtype, inputs["S"].tolist()) == (np.float32, [[1.0], [1.0]])
    assert (inputs["E"].dtype, inputs["E"].tolist()) == (np.bool_, [[False], [True]])
    assert (inputs["R"].dtype, inputs["R"].tolist()) == (np.int32, [[7], [7]])
    assert (inputs["C"].dtype, inputs["C"].tolist()) == (np.uint64, [[5], [6]])
    described = sequences.settings.describe()["control_input"]
    assert described[0]["control"] == [
        {"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0.0, 1.0]}
    ]
    assert described[3]["control"] == [
        {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}
    ]
    # An id the correlation id's type cannot hold is refused at its start.
    with pytest.raises(BadRequest, match="input C is UINT64: send an integer"):
        sequences.admit(step(1, sequence_id="x", sequence_start=True), 0.0)
    with pytest.raises(BadRequest, match="does not fit its correlation id input C"):
        sequences.admit(step(1, sequence_id=-3, sequence_start=True), 0.0)


def test_a_state_of_free_size_starts_at_one_and_batches_with_its_own_shape() -> None:
    grows = State("IN", "OUT", DType.INT32, (-1,))
    sequences = Sequences(SequenceSettings("m", "oldest", 60.0, 8, 4, (grows,), {}))
    batcher = batcher_for(4, 0.0, sequences)
    first = [
        step(1, 1, sequence_id=1, sequence_start=True),
        step(2, 2, sequence_id=2, sequence_start=True),
    ]
    for pending in first:
        sequences.admit(pending, 0.0)
        batcher.add(pending)
    batch = batcher.take(time.monotonic())
    inputs = sequences.inputs(batch, batch_inputs(batch))
    assert inputs["IN"].tolist() == [[0], [0]]
    # Sequence 1's state grows to two elements; sequence 2's stays at one.
    sequences.keep(batch[:1], {"OUT": np.array([[1, 1]], np.int32)})
    sequences.keep(batch[1:], {"OUT": np.array([[2]], np.int32)})
    later = [step(3, 3, sequence_id=1), step(4, 4, sequence_id=2)]
    for pending in later:
        sequences.admit(pending, 0.0)
        batcher.add(pending)
    shapes = []
    while batch := batcher.take(time.monotonic()):
        shapes.append(sequences.inputs(batch, batch_inputs(batch))["IN"].shape)
    assert shapes == [(1, 2), (1, 1)]
