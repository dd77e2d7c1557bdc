"""Zero-copy pass-through: outputs that are views of request tensors.

When a model returns (part of) an input as an output (identity, a slice, a
reshape), those bytes already sit in the client's request ring. The worker
then answers with a reference to them instead of copying them into its own
response ring; the client keeps that request block until it releases the
result. A model's ``passthrough = false`` config turns this off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from appliance.core.dtypes import DType
from appliance.core.message_tensors import SegmentReader
from appliance.core.tensor import Array, Tensor

# (first address, end address, segment, offset in segment) of one input.
Span = tuple[int, int, str, int]


def address(array: Array) -> int:
    return int(array.__array_interface__["data"][0])


def input_spans(entries: Iterable[Sequence[Any]], reader: SegmentReader) -> list[Span]:
    """Where each input that lives in shared memory is, in this process's mappings."""
    spans = []
    for _name, dtype, _shape, place in entries:
        if type(place) is not list or dtype == "BYTES":
            continue
        segment, offset, nbytes = str(place[0]), int(place[1]), int(place[2])
        start = reader.base(segment) + offset
        spans.append((start, start + nbytes, segment, offset))
    return spans


def borrowed_entries(outputs: Mapping[str, Tensor], spans: list[Span]) -> dict[str, list[Any]]:
    """Return descriptor entries for the outputs that lie inside an input."""
    entries: dict[str, list[Any]] = {}
    for name, tensor in outputs.items():
        if tensor.dtype is DType.BYTES:
            continue
        array = tensor.array()
        if not array.flags.c_contiguous or array.nbytes == 0:
            continue
        start = address(array)
        end = start + array.nbytes
        for first, last, segment, offset in spans:
            if first <= start and end <= last:
                place = [segment, offset + start - first, array.nbytes]
                entries[name] = [name, tensor.dtype.value, list(tensor.shape), place]
                break
    return entries
