"""GRPS payloads onto models' inputs and outputs back (bind.py), without a server."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, spec
from appliance.protocols.grps.bind import ReplyShaper, bind
from appliance.protocols.grps.errors import GrpsError
from appliance.protocols.grps.payload import Kind, MapField, Payload


def model(name: str, inputs: list[Any] | None, outputs: list[Any] | None = None) -> ModelMetadata:
    return ModelMetadata(
        name=name,
        versions=("1",),
        platform="python",
        inputs=None if inputs is None else tuple(inputs),
        outputs=None if outputs is None else tuple(outputs),
        max_batch_size=0,
    )


ECHO = model("echo", None)
SIMPLE = model("simple", [spec("INPUT0", "INT32", [-1, 16]), spec("INPUT1", "INT32", [-1, 16])])
DIGITS = model("digits", [spec("pixels", "FP32", [-1, 64])])
FORWARD = model("forward", [spec("x", "FP64", [-1, 1])])
IDENTITY = model("simple_identity", [spec("INPUT0", "BYTES", [-1, -1])])


def t(array: Any) -> Tensor:
    return Tensor.from_array(np.asarray(array))


def test_unnamed_gtensors_take_declared_names_in_order() -> None:
    payload = Payload(Kind.GTENSORS, tensors=[("", t([[1] * 16])), ("", t([[2] * 16]))])
    assert list(bind(payload, SIMPLE)) == ["INPUT0", "INPUT1"]
    assert list(bind(payload, ECHO)) == ["tensor0", "tensor1"]
    three = Payload(Kind.GTENSORS, tensors=[("", t([1]))] * 3)
    with pytest.raises(GrpsError, match="declares only 2 inputs"):
        bind(three, SIMPLE)
    twice = Payload(Kind.GTENSORS, tensors=[("a", t([1])), ("a", t([2]))])
    with pytest.raises(GrpsError, match="more than one tensor is named 'a'"):
        bind(twice, ECHO)


def test_ndarray_binds_to_the_single_float_input_with_its_dtype() -> None:
    payload = Payload(Kind.NDARRAY, array=np.zeros((2, 64)))
    (tensor,) = bind(payload, DIGITS).values()
    assert (tensor.dtype, tensor.shape) == (DType.FP32, (2, 64))
    (x,) = bind(Payload(Kind.NDARRAY, array=np.array([[3.0]])), FORWARD).values()
    assert x.dtype is DType.FP64
    assert bind(Payload(Kind.NDARRAY, array=np.ones(3)), ECHO)["ndarray"].dtype is DType.FP32
    with pytest.raises(GrpsError, match="does not match the declared shape"):
        bind(Payload(Kind.NDARRAY, array=np.zeros((1, 3))), DIGITS)
    with pytest.raises(GrpsError, match="model simple takes tensors INPUT0, INPUT1; send gtensors"):
        bind(Payload(Kind.NDARRAY, array=np.zeros((1, 16))), SIMPLE)
    with pytest.raises(GrpsError, match="only in HTTP JSON"):
        bind(Payload(Kind.NDARRAY), DIGITS)


def test_str_and_bin_data_bind_as_one_bytes_element() -> None:
    generic = bind(Payload(Kind.STR_DATA, data="héllo"), ECHO)
    assert generic["str_data"].shape == (1,)
    assert generic["str_data"].array()[0] == "héllo".encode()
    shaped = bind(Payload(Kind.BIN_DATA, data=b"\x00"), IDENTITY)["INPUT0"]
    assert (shaped.shape, shaped.array()[0, 0]) == ((1, 1), b"\x00")
    with pytest.raises(GrpsError, match="model digits takes tensors pixels; send gtensors") as bad:
        bind(Payload(Kind.STR_DATA, data="x"), DIGITS)
    assert bad.value.code == 400


def test_gmap_entries_become_tensors_named_by_key() -> None:
    gmap = {MapField.S_S: {"s": "x"}, MapField.S_I64: {"n": 5}, MapField.S_F: {"f": 0.5}}
    bound = bind(Payload(Kind.GMAP, gmap=gmap), ECHO)
    assert {name: (tensor.dtype, tensor.shape) for name, tensor in bound.items()} == {
        "s_s.s": (DType.BYTES, (1,)),
        "s_i64.n": (DType.INT64, (1,)),
        "s_f.f": (DType.FP32, (1,)),
    }
    # A declared input sets the rank and (when no value changes) the dtype.
    x = bind(Payload(Kind.GMAP, gmap={MapField.S_I32: {"x": 4}}), FORWARD)["x"]
    assert (x.dtype, x.shape, x.array().tolist()) == (DType.FP64, (1, 1), [[4.0]])
    # GRPS's example clients put one key in every map: fine for a generic
    # model, ambiguous for a declared input.
    clash = {MapField.S_I32: {"x": 1}, MapField.S_D: {"x": 2.0}}
    assert list(bind(Payload(Kind.GMAP, gmap=clash), ECHO)) == ["s_i32.x", "s_d.x"]
    with pytest.raises(GrpsError, match="appears in both s_i32 and s_d"):
        bind(Payload(Kind.GMAP, gmap=clash), FORWARD)


def test_replies_keep_the_request_kind_when_the_outputs_fit() -> None:
    outputs = {"str_data": t(np.array([b"hi"], dtype=object))}
    reply = ReplyShaper(Payload(Kind.STR_DATA, data="hi")).shape(outputs)
    assert (reply.kind, reply.data) == (Kind.STR_DATA, "hi")
    reply = ReplyShaper(Payload(Kind.BIN_DATA)).shape({"OUTPUT0": outputs["str_data"]})
    assert (reply.kind, reply.data) == (Kind.BIN_DATA, b"hi")
    # Two outputs are no single string: the reply falls back to gtensors.
    two = {"a": outputs["str_data"], "b": outputs["str_data"]}
    assert ReplyShaper(Payload(Kind.STR_DATA)).shape(two).kind is Kind.GTENSORS
    many = {"y": t(np.zeros((2, 2)))}
    assert ReplyShaper(Payload(Kind.GMAP)).shape(many).kind is Kind.GTENSORS
    with pytest.raises(GrpsError, match="floating-point output") as caught:
        ReplyShaper(Payload(Kind.STR_DATA), want_ndarray=True).shape(outputs)
    assert caught.value.code == 500


def test_gmap_replies_go_back_to_the_map_each_key_came_from() -> None:
    request = {
        MapField.S_B: {"raw": b"abc"},
        MapField.S_I64: {"small": 1},
        MapField.S_D: {"d": 1.0},
    }
    outputs = {
        "raw": t(np.array([b"abc"], dtype=object)),
        "small": t(np.array([1], dtype=np.int64)),
        "d": t(np.array([1.0])),
        "new_text": t(np.array([b"\xff"], dtype=object)),
        "new_int": t(np.array([7], dtype=np.int16)),
    }
    reply = ReplyShaper(Payload(Kind.GMAP, gmap=request)).shape(outputs)
    assert reply.gmap == {
        MapField.S_B: {"raw": b"abc", "new_text": b"\xff"},
        MapField.S_I64: {"small": 1},
        MapField.S_D: {"d": 1.0},
        MapField.S_I32: {"new_int": 7},
    }


def test_streamed_text_keeps_characters_cut_between_parts() -> None:
    shaper = ReplyShaper(Payload(Kind.STR_DATA))
    data = "é€".encode()  # 5 bytes
    texts = [
        shaper.shape({"str_data": t(np.array([piece], dtype=object))}, final=False).data
        for piece in (data[:1], data[1:3], data[3:])
    ]
    shaper.finish()
    assert texts == ["", "é", "€"]
    broken = ReplyShaper(Payload(Kind.STR_DATA))
    broken.shape({"str_data": t(np.array([data[:1]], dtype=object))}, final=False)
    with pytest.raises(GrpsError, match="not UTF-8"):
        broken.finish()


def test_gmap_replies_of_generic_models_go_back_to_their_maps() -> None:
    request = Payload(Kind.GMAP, gmap={MapField.S_S: {"key": "a"}, MapField.S_B: {"key": b"b"}})
    outputs = {
        "s_s.key": t(np.array([b"a"], dtype=object)),
        "s_b.key": t(np.array([b"b"], dtype=object)),
        "s_i32.key": t(np.array([1], dtype=np.int64)),
        "s_f.key": t(np.array([0.5], dtype=np.float32)),
        "s_d.odd": t(np.array([b"not a double"], dtype=object)),
    }
    reply = ReplyShaper(request).shape(outputs)
    assert reply.gmap == {
        MapField.S_S: {"key": "a", "s_d.odd": "not a double"},
        MapField.S_B: {"key": b"b"},
        MapField.S_I32: {"key": 1},
        MapField.S_F: {"key": 0.5},
    }


def test_streamed_map_text_is_decoded_per_key() -> None:
    shaper = ReplyShaper(Payload(Kind.GMAP, gmap={MapField.S_S: {"k": "é"}}))
    data = "é".encode()
    first = shaper.shape({"s_s.k": t(np.array([data[:1]], dtype=object))}, final=False)
    second = shaper.shape({"s_s.k": t(np.array([data[1:]], dtype=object))}, final=False)
    shaper.finish()
    assert (first.gmap, second.gmap) == ({MapField.S_S: {"k": ""}}, {MapField.S_S: {"k": "é"}})
