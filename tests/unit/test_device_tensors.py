"""Tensors in a client's GPU memory, as descriptors carry them (no GPU needed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from appliance.core.device_tensors import (
    CudaPlace,
    DeviceArray,
    DeviceTensor,
    device_array,
    empty_like,
    is_cuda_place,
    on_device,
)
from appliance.core.dtypes import DType
from appliance.core.message_tensors import SegmentReader, place_tensors, read_tensors, ring_blocks
from appliance.core.ring import Block
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest

PLACE = CudaPlace("pixels", 7, "AAAA", 0, 128, 15360)


class Unused:
    """An allocator that must not be asked: GPU places take no ring space."""

    def alloc(self, nbytes: int) -> Block:
        raise AssertionError("a GPU tensor was written into the ring")

    def view(self, block: Block) -> memoryview:
        raise AssertionError("a GPU tensor was written into the ring")


def test_a_gpu_input_travels_as_its_place_and_comes_back_as_a_placeholder() -> None:
    payloads: list[Any] = []
    blocks: list[Block] = []
    tensors = {
        "pixels": DeviceTensor(DType.FP32, (60, 64), PLACE),
        "scale": Tensor.from_array(np.array([2.0], np.float32)),
    }
    entries = place_tensors(tensors, Unused(), 1024, payloads, blocks)
    assert entries[0] == ["pixels", "FP32", [60, 64], PLACE.to_body()]
    assert is_cuda_place(entries[0][3])
    assert not is_cuda_place(entries[1][3])
    assert blocks == []
    assert ring_blocks(entries) == []
    read = read_tensors(entries, payloads, SegmentReader(None))
    assert read["pixels"].shape == (60, 64)
    assert read["pixels"].dtype is DType.FP32
    placeholder = read["pixels"].array()
    assert placeholder.shape == (60, 64)
    assert placeholder.dtype == np.float32
    assert not placeholder.flags.writeable
    assert placeholder.strides == (0, 0)
    assert CudaPlace.from_body(entries[0][3]) == PLACE


@pytest.mark.parametrize(
    "place",
    [
        {"cuda": ["r", 1, "AAAA", 0, 0]},
        {"cuda": ["r", "x", "AAAA", 0, 0, 4]},
        {"cuda": ["r", 1, "AAAA", 0, -8, 4]},
        {"cuda": 5},
    ],
)
def test_a_malformed_place_is_a_bad_request(place: Any) -> None:
    entries = [["pixels", "FP32", [1], place]]
    with pytest.raises(BadRequest, match="tensor descriptor"):
        read_tensors(entries, [], SegmentReader(None))


def test_bytes_cannot_lie_in_gpu_memory() -> None:
    entries = [["words", "BYTES", [2], PLACE.to_body()]]
    with pytest.raises(BadRequest, match="BYTES tensors cannot lie in GPU memory"):
        read_tensors(entries, [], SegmentReader(None))


class Exported:
    """Something that shows GPU memory by the CUDA array interface (as torch tensors do)."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...] | None) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": "<f4",
            "data": (4096, False),
            "version": 3,
            "strides": strides,
        }


def test_gpu_outputs_are_taken_when_contiguous_and_refused_otherwise() -> None:
    array = device_array(Exported((4, 8), None), 0)
    assert (array.pointer, array.shape, array.dtype, array.nbytes) == (4096, (4, 8), "float32", 128)
    assert device_array(Exported((4, 8), (32, 4)), 0).shape == (4, 8)
    with pytest.raises(ValueError, match="not C-contiguous"):
        device_array(Exported((4, 8), (4, 16)), 0)
    interface = DeviceArray(8192, (2, 3), np.dtype(np.int64), 1).__cuda_array_interface__
    assert interface["data"] == (8192, False)
    assert interface["typestr"] == "<i8"
    assert on_device(array)
    assert not on_device(np.zeros(3))


def test_a_placeholder_costs_no_memory() -> None:
    big = empty_like((1 << 20, 1 << 10), DType.FP64)
    assert big.shape == (1 << 20, 1 << 10)
    assert big.nbytes == 8 << 30
    assert big.strides == (0, 0)
    assert not big.flags.writeable
