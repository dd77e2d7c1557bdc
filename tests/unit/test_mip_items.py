"""MIP items <-> model rows, and batches <-> core requests (pure, no sockets)."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, spec
from appliance.errors import BadRequest, ModelFailed, Overloaded, TooLarge, Unsupported
from appliance.protocols.mip import batch, codec, image, items
from appliance.protocols.mip.client import encode_request, json_item, tensor_item, text_item
from appliance.protocols.mip.codec import ErrorCode, Item, ItemType, MipError
from appliance.protocols.mip.errors import from_appliance


def item(kind: ItemType, data: bytes) -> Item:
    return Item(kind, memoryview(data))


def decode(kind: ItemType, data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return items.decode_row(item(kind, data), spec("x", dtype, (-1, *shape)), shape, "here")


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def metadata(
    inputs: list[Any] | None, outputs: list[Any] | None, max_batch: int = 0
) -> ModelMetadata:
    return ModelMetadata(
        "m",
        ("1",),
        "python",
        None if inputs is None else tuple(inputs),
        None if outputs is None else tuple(outputs),
        max_batch,
    )


def request(elements: list[list[tuple[ItemType, bytes]]]) -> codec.InferRequest:
    return codec.decode_infer_request(encode_request(elements)[8:])


# -- requests: items -> rows -------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "dtype", "shape", "expected"),
    [
        (b"[1, 2, 3]", "INT32", (3,), np.array([1, 2, 3], np.int32)),
        (b"[1.0, 2.0]", "INT8", (2,), np.array([1, 2], np.int8)),
        (b"[[1, 2], [3, 4]]", "FP32", (2, 2), np.array([[1, 2], [3, 4]], np.float32)),
        (b"[1, 2, 3, 4]", "FP64", (2, 2), np.array([[1, 2], [3, 4]], np.float64)),
        (b"2.5", "FP64", (1,), np.array([2.5])),
        (b"[true, false]", "BOOL", (-1,), np.array([True, False])),
        (b"[18446744073709551615]", "UINT64", (1,), np.array([2**64 - 1], np.uint64)),
    ],
)
def test_json_converts_exactly(
    data: bytes, dtype: str, shape: tuple[int, ...], expected: np.ndarray
) -> None:
    row = decode(ItemType.JSON, data, dtype, shape)
    assert row.dtype == expected.dtype
    np.testing.assert_array_equal(row, expected)


@pytest.mark.parametrize(
    ("data", "dtype", "shape", "words"),
    [
        (b"[1.5]", "INT32", (1,), "non-integers"),
        (b"[300]", "UINT8", (1,), "outside 0..255"),
        (b"[-1]", "UINT32", (1,), "outside"),
        (b"[16777217]", "FP32", (1,), "not exact"),
        (b"[1e300]", "FP32", (1,), "overflows"),
        (b"[1, 0]", "BOOL", (2,), "true/false"),
        (b"[true]", "FP32", (1,), "numbers"),
        (b'["1"]', "INT32", (1,), "numbers"),
        (b"[[1], [2, 3]]", "INT32", (-1, -1), "ragged"),
        (b"[1, 2, 3]", "INT32", (2,), r"shape \[3\]"),
        (b"{", "INT32", (1,), "not valid JSON"),
        (b'{"a": 1}', "INT32", (1,), "numbers"),
    ],
)
def test_json_that_does_not_fit_is_a_shape_error(
    data: bytes, dtype: str, shape: tuple[int, ...], words: str
) -> None:
    with pytest.raises(MipError, match=words) as caught:
        decode(ItemType.JSON, data, dtype, shape)
    assert caught.value.code is ErrorCode.SHAPE


def test_text_is_parsed_as_json_for_numeric_inputs() -> None:
    assert decode(ItemType.TEXT, b"[1, 2]", "INT64", (2,)).tolist() == [1, 2]


def test_strings_for_bytes_inputs() -> None:
    assert decode(ItemType.TEXT, "héllo".encode(), "BYTES", (-1,)).tolist() == ["héllo".encode()]
    assert decode(ItemType.TEXT, b"x", "BYTES", ()).tolist() == b"x"
    assert decode(ItemType.JSON, b'["a", "b"]', "BYTES", (2,)).tolist() == [b"a", b"b"]
    assert decode(ItemType.IMAGE, b"\x89PNG", "BYTES", (1,)).tolist() == [b"\x89PNG"]
    with pytest.raises(MipError, match="must be strings"):
        decode(ItemType.JSON, b"[1, 2]", "BYTES", (2,))
    with pytest.raises(MipError, match=r"expects \[16\]"):
        decode(ItemType.TEXT, b"one string", "BYTES", (16,))


def test_generic_models_get_items_as_they_are() -> None:
    row = items.decode_row(item(ItemType.JSON, b'{"a": 1}'), None, (), "here")
    assert row.shape == ()
    assert row[()] == b'{"a": 1}'
    _kind, data = tensor_item(np.arange(6, dtype=np.int16).reshape(2, 3))
    tensor = items.decode_row(item(ItemType.TENSOR, data), None, (), "here")
    assert tensor.dtype == np.int16
    assert tensor.shape == (2, 3)


def test_tensor_items_must_have_the_declared_dtype_and_row_shape() -> None:
    _kind, data = tensor_item(np.zeros(4, np.float32))
    assert decode(ItemType.TENSOR, data, "FP32", (-1,)).shape == (4,)
    with pytest.raises(MipError, match="dtype FP32, the input is FP64"):
        decode(ItemType.TENSOR, data, "FP64", (4,))
    with pytest.raises(MipError, match=r"expects \[2, 2\]"):
        decode(ItemType.TENSOR, tensor_item(np.zeros(3, np.float32))[1], "FP32", (2, 2))


# -- images ------------------------------------------------------------------------------------


def test_images_decode_for_image_like_inputs() -> None:
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert np.array_equal(decode(ItemType.IMAGE, png(rgb), "UINT8", (-1, -1, 3)), rgb)
    wide = np.arange(2 * 5 * 3, dtype=np.uint8).reshape(2, 5, 3)
    first = decode(ItemType.IMAGE, png(wide), "FP32", (3, 2, 5))
    assert first.dtype == np.float32
    np.testing.assert_array_equal(first, np.moveaxis(wide, 2, 0))
    grey = decode(ItemType.IMAGE, png(rgb), "INT32", (2, 3))
    assert grey.shape == (2, 3)
    assert grey.dtype == np.int32


@pytest.mark.parametrize(
    ("data", "dtype", "shape", "words"),
    [
        (None, "FP32", (64,), "image-like"),
        (None, "INT8", (-1, -1), "image-like"),
        (None, "UINT8", (5, 5, 3), "not resized"),
        (b"GIF89a but not really", "UINT8", (-1, -1), "not an image"),
    ],
)
def test_images_that_do_not_fit_are_shape_errors(
    data: bytes | None, dtype: str, shape: tuple[int, ...], words: str
) -> None:
    data = data or png(np.zeros((2, 3, 3), np.uint8))
    with pytest.raises(MipError, match=words) as caught:
        decode(ItemType.IMAGE, data, dtype, shape)
    assert caught.value.code is ErrorCode.SHAPE


def test_pixel_outputs_go_back_as_png() -> None:
    pixels = np.full((4, 4, 3), 7, np.uint8)
    assert image.is_pixels(pixels)
    assert items.reply_type(ItemType.IMAGE, pixels) is ItemType.IMAGE
    [data] = items.encode_row(ItemType.IMAGE, pixels, False, "here")
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), pixels)
    assert items.reply_type(ItemType.IMAGE, np.zeros(3)) is ItemType.JSON


# -- replies: rows -> items -----------------------------------------------------------------


def test_rows_encode_in_the_requested_item_type() -> None:
    numbers = np.array([1.5, 2.0], np.float32)
    assert items.encode_row(ItemType.JSON, numbers, False, "here") == [b"[1.5,2.0]"]
    assert items.encode_row(ItemType.TEXT, numbers, False, "here") == [b"[1.5,2.0]"]
    assert items.encode_row(ItemType.JSON, np.array(3.0), False, "here") == [b"3.0"]
    one = np.array([b"raw"], dtype=object)
    assert items.encode_row(ItemType.TEXT, one, False, "here") == [b"raw"]
    assert items.encode_row(ItemType.JSON, one, False, "here") == [b'["raw"]']
    assert items.encode_row(ItemType.JSON, one, True, "here") == [b"raw"]
    with pytest.raises(MipError, match="not UTF-8") as caught:
        items.encode_row(ItemType.JSON, np.array([b"\xff", b""], dtype=object), False, "here")
    assert caught.value.code is ErrorCode.INTERNAL


# -- batches ----------------------------------------------------------------------------------


def test_a_batch_is_stacked_into_one_request_per_max_batch_size() -> None:
    meta = metadata([spec("x", "FP32", [-1, 2])], [spec("y", "FP32", [-1, 2])], max_batch=4)
    binding = batch.bind(meta, 1)
    req = request([[tensor_item(np.full(2, i, np.float32))] for i in range(10)])
    chunks = batch.plan(binding, req)
    assert [(c.start, c.rows) for c in chunks] == [(0, 4), (4, 4), (8, 2)]
    assert chunks[2].inputs["x"].tolist() == [[8, 8], [9, 9]]
    outputs = {"y": Tensor.from_array(chunks[1].inputs["x"] * 2)}
    names, rows = batch.encode_chunk(binding, chunks[1], req, outputs)
    assert names == ("y",)
    assert len(rows) == 4
    assert b"".join(rows[0])[:8] == bytes([0, 0, 0, 4, 0, 0, 0, 16])


def test_ragged_batches_go_one_element_per_request() -> None:
    binding = batch.bind(metadata(None, None), 1)
    req = request([[tensor_item(np.zeros(n))] for n in (1, 2, 3)])
    chunks = batch.plan(binding, req)
    assert [c.inputs["input0"].shape for c in chunks] == [(1, 1), (1, 2), (1, 3)]


def test_models_without_a_batch_dimension_get_whole_tensors() -> None:
    meta = metadata([spec("x", "FP32", [2, 2])], [spec("y", "FP32", [2, 2])])
    binding = batch.bind(meta, 1)
    req = request([[json_item([[1, 2], [3, 4]])], [json_item([5, 6, 7, 8])]])
    chunks = batch.plan(binding, req)
    assert [c.inputs["x"].tolist() for c in chunks] == [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    _names, rows = batch.encode_chunk(
        binding, chunks[1], req, {"y": Tensor.from_array(chunks[1].inputs["x"])}
    )
    assert b"".join(rows[0])[8:] == b"[[5.0,6.0],[7.0,8.0]]"


def test_binding_checks_the_input_count_and_outputs() -> None:
    meta = metadata(
        [spec("a", "INT32", [-1, 1]), spec("b", "INT32", [-1, 1])], [spec("c", "INT32", [-1, 1])]
    )
    with pytest.raises(MipError, match="has 2 inputs"):
        batch.bind(meta, 1)
    binding = batch.bind(meta, 2)
    req = request([[text_item("1"), text_item("2")]] * 3)
    [chunk] = batch.plan(binding, req)
    with pytest.raises(MipError, match="did not return outputs") as caught:
        batch.encode_chunk(binding, chunk, req, {})
    assert caught.value.code is ErrorCode.INTERNAL
    short = {"c": Tensor(DType.INT32, (2, 1), np.zeros((2, 1), np.int32))}
    with pytest.raises(MipError, match="for a batch of 3"):
        batch.encode_chunk(binding, chunk, req, short)


def test_appliance_errors_map_onto_mip_codes() -> None:
    assert from_appliance(BadRequest("x")).code is ErrorCode.SHAPE
    assert from_appliance(Unsupported("x")).code is ErrorCode.METHOD
    assert from_appliance(TooLarge("x")).code is ErrorCode.MEMORY
    assert from_appliance(Overloaded("x")).code is ErrorCode.MEMORY
    failed = from_appliance(ModelFailed("model m failed"))
    assert (failed.code, failed.message) == (ErrorCode.INTERNAL, "model m failed")


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(list(ItemType)),
    st.binary(max_size=64),
    st.sampled_from(["FP32", "INT8", "UINT64", "BOOL", "BYTES", "UINT8"]),
    st.sampled_from([(), (2,), (-1,), (2, 2), (-1, -1, 3)]),
)
def test_any_item_either_decodes_or_raises_mip_error(
    kind: ItemType, data: bytes, dtype: str, shape: tuple[int, ...]
) -> None:
    with contextlib.suppress(MipError):
        decode(kind, data, dtype, shape)
