"""The appliance's triton_python_backend_utils, as Triton Python models use it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from appliance.runtimes import python_backend_utils as pb_utils


def test_bytes_tensors_serialize_as_triton_lays_them_out_and_back() -> None:
    values = np.array([b"ab", "c", b""], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded is not None
    assert encoded.tobytes() == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00"
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == [b"ab", b"c", b""]


@pytest.mark.parametrize(
    ("name", "number", "numpy"),
    [("TYPE_FP32", 11, np.float32), ("TYPE_INT64", 9, np.int64), ("TYPE_STRING", 13, np.object_)],
)
def test_type_names_numbers_and_numpy_types_agree(name: str, number: int, numpy: type) -> None:
    assert pb_utils.triton_string_to_numpy(name) is numpy
    assert pb_utils.triton_to_numpy_type(number) is numpy
    assert pb_utils.numpy_to_triton_type(numpy) == number


def test_tensors_are_found_by_name_and_travel_by_dlpack() -> None:
    x = pb_utils.Tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    request = pb_utils.InferenceRequest(inputs=[x], parameters={"k": 1})
    assert pb_utils.get_input_tensor_by_name(request, "x") is x
    assert pb_utils.get_input_tensor_by_name(request, "y") is None
    assert json.loads(request.parameters()) == {"k": 1}
    back = pb_utils.Tensor.from_dlpack("y", x.to_dlpack())
    assert np.array_equal(back.as_numpy(), x.as_numpy())
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("z", [1, 2, 3])


def test_a_call_outside_a_model_worker_answers_with_an_error_not_an_exception() -> None:
    request = pb_utils.InferenceRequest(model_name=b"other")
    assert request.model_name() == "other"
    response = request.exec()
    assert response.has_error()
    assert "serves no model" in response.error().message()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        request.get_response_sender()


def test_a_response_sender_takes_responses_until_the_final_flag() -> None:
    sent: list[tuple[object, int]] = []
    sender = pb_utils.InferenceResponseSender(lambda r, flags: sent.append((r, flags)))
    response = pb_utils.InferenceResponse([pb_utils.Tensor("y", np.zeros(1))])
    sender.send(response)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(response, 0), (None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        sender.send(response)


def test_metrics_refuse_what_their_kind_does_not_do() -> None:
    counter = pb_utils.MetricFamily("unit_counter", "c", pb_utils.MetricFamily.COUNTER).Metric()
    counter.increment(2)
    assert counter.value() == 2
    with pytest.raises(pb_utils.TritonModelException, match="only a gauge is set"):
        counter.set(1)
    with pytest.raises(pb_utils.TritonModelException, match="cannot increment by -1"):
        counter.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="is a counter already"):
        pb_utils.MetricFamily("unit_counter", "c", pb_utils.MetricFamily.GAUGE)
    histogram = pb_utils.MetricFamily("unit_histogram", "h", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException, match="needs its buckets"):
        histogram.Metric()
    observed = histogram.Metric(labels={"a": "b"}, buckets=[1.0])
    observed.observe(3.0)
    assert observed.value() == 3.0


def test_auto_complete_adds_tensors_and_refuses_contradictions() -> None:
    config = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": []}))
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    assert config.as_dict()["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}]
    assert config.as_dict()["dynamic_batching"] == {}
    with pytest.raises(ValueError, match="dims"):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="max_batch_size"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="format"):
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [1], "format": 1})
