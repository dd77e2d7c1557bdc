"""A MIP batch <-> requests to the model, and their outputs <-> reply items.

SPEC: DESIGN.md "Models" — item i of each batch element is the model's i-th
input, and the batch size is the model's leading dimension:

* The items of one input are stacked into one tensor (batch, *row shape),
  so a whole batch rides the core as one request. A batch larger than the
  model's max_batch_size is cut into chunks of at most that many rows (sent
  concurrently, reassembled in order).
* Items that cannot be stacked (rows of different shapes or dtypes) go as
  one request per batch element, each with a leading dimension of 1.
* A model whose inputs have no leading -1 dimension gets each batch element
  as its own request, item = whole tensor, output = whole tensor.
* A generic model (no declared inputs, like ``echo``) gets inputs named
  ``input0``, ``input1``, ...; its outputs come back in the order it returns
  them. Declared outputs come back in declared order.

Reply item j of an element has the type of that element's request item j
(the last request item's type for j >= n-input); see items.reply_type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, TensorSpec
from appliance.protocols.mip import items
from appliance.protocols.mip.codec import (
    ErrorCode,
    InferRequest,
    MipError,
    Piece,
    encode_item,
)

Array = npt.NDArray[Any]
MAX_COUNT = 255  # n-input and n-output are u8
# The most bytes one request's items may decode to (images, JSON as numbers).
MAX_DECODED_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Binding:
    """How a MIP request maps onto one model."""

    model: str
    names: tuple[str, ...]
    specs: tuple[TensorSpec | None, ...]
    outputs: tuple[str, ...] | None  # None: whatever a generic model returns
    stacked: bool  # the leading dimension is the batch
    max_rows: int  # rows per core request; 0 = no limit

    @property
    def generic(self) -> bool:
        return self.outputs is None

    def row_shape(self, index: int) -> tuple[int, ...]:
        spec = self.specs[index]
        if spec is None:
            return ()
        return spec.shape[1:] if self.stacked else spec.shape


@dataclass(frozen=True, slots=True)
class Chunk:
    """One request to the core: ``rows`` batch elements from ``start``."""

    start: int
    rows: int
    inputs: dict[str, Array]


def bind(metadata: ModelMetadata, n_input: int) -> Binding:
    """Map a request with ``n_input`` items per element onto the model.

    Raises:
        MipError: SHAPE when the model declares a different number of inputs.
    """
    if metadata.inputs is None:
        names = tuple(f"input{index}" for index in range(n_input))
        return Binding(metadata.name, names, (None,) * n_input, None, True, 0)
    declared = metadata.inputs
    if n_input != len(declared):
        raise MipError(
            ErrorCode.SHAPE,
            f"model {metadata.name} has {len(declared)} inputs "
            f"({', '.join(spec.name for spec in declared)}); the request has n-input {n_input}",
        )
    outputs = tuple(spec.name for spec in metadata.outputs or ())
    stacked = all(spec.shape[:1] == (-1,) for spec in declared)
    max_rows = metadata.max_batch_size if stacked else 1
    return Binding(
        metadata.name, tuple(s.name for s in declared), tuple(declared), outputs, stacked, max_rows
    )


def plan(binding: Binding, request: InferRequest) -> list[Chunk]:
    """Decode every item and group the rows into requests to the core.

    Raises:
        MipError: SHAPE when an item does not fit its input.
    """
    budget = [MAX_DECODED_BYTES]
    columns = [_column(binding, request, index, budget) for index in range(request.n_input)]
    batch = request.batch_size
    if not binding.stacked:
        return [
            Chunk(
                e, 1, {name: column[e] for name, column in zip(binding.names, columns, strict=True)}
            )
            for e in range(batch)
        ]
    if not all(_uniform(column) for column in columns):
        return [
            Chunk(e, 1, {n: c[e][np.newaxis] for n, c in zip(binding.names, columns, strict=True)})
            for e in range(batch)
        ]
    step = binding.max_rows or batch
    return [
        Chunk(start, min(step, batch - start), _stack(binding.names, columns, start, step))
        for start in range(0, batch, step)
    ]


def _column(binding: Binding, request: InferRequest, index: int, budget: list[int]) -> list[Array]:
    """Decode one input's items; ``budget[0]`` is what decoded rows may still take."""
    spec, shape = binding.specs[index], binding.row_shape(index)
    name = binding.names[index]
    rows = []
    for element in range(request.batch_size):
        row = items.decode_row(
            request.item(element, index),
            spec,
            shape,
            f"model {binding.model} input {name} (batch element {element})",
        )
        budget[0] -= row.nbytes
        if budget[0] < 0:
            # A small compressed image can decode to MAX_PIXELS: many of them
            # in one frame would add up to far more than the frame.
            raise MipError(
                ErrorCode.MEMORY,
                f"model {binding.model}: the request's items decode to more than "
                f"{MAX_DECODED_BYTES} bytes (at input {name}, batch element {element})",
            )
        rows.append(row)
    return rows


def _uniform(column: list[Array]) -> bool:
    first = column[0]
    return all(row.shape == first.shape and row.dtype == first.dtype for row in column)


def _stack(
    names: Sequence[str], columns: list[list[Array]], start: int, step: int
) -> dict[str, Array]:
    inputs = {}
    for name, column in zip(names, columns, strict=True):
        rows = column[start : start + step]
        # PERF: a batch of one is a view of the received frame, not a copy.
        inputs[name] = rows[0][np.newaxis] if len(rows) == 1 else np.stack(rows)
    return inputs


def output_names(binding: Binding, outputs: Mapping[str, Tensor]) -> tuple[str, ...]:
    """The outputs sent back, in order.

    Raises:
        MipError: INTERNAL when a declared output is missing or there are
            more than n-output can count.
    """
    names = binding.outputs if binding.outputs is not None else tuple(outputs)
    missing = [name for name in names if name not in outputs]
    if missing:
        raise MipError(
            ErrorCode.INTERNAL, f"model {binding.model} did not return outputs {missing}"
        )
    if len(names) > MAX_COUNT:
        raise MipError(
            ErrorCode.INTERNAL,
            f"model {binding.model} returned {len(names)} outputs; MIP counts at most {MAX_COUNT}",
        )
    return names


def encode_chunk(
    binding: Binding, chunk: Chunk, request: InferRequest, outputs: Mapping[str, Tensor]
) -> tuple[tuple[str, ...], list[list[Piece]]]:
    """Encode a chunk's outputs; return the output names and, per row, its items.

    The pieces may be views of the outputs: join them into the reply frame
    before the result holding the outputs is released.

    Raises:
        MipError: INTERNAL when an output lacks the batch dimension or cannot
            be sent in the requested item type.
    """
    names = output_names(binding, outputs)
    arrays = [_rows(binding, chunk, name, outputs[name]) for name in names]
    encoded = []
    for row in range(chunk.rows):
        element = chunk.start + row
        pieces: list[Piece] = []
        for position, (name, array) in enumerate(zip(names, arrays, strict=True)):
            # [row, ...] keeps a 0-d array (not a scalar) for 1-D outputs.
            value = array[row, ...] if binding.stacked else array
            asked = request.item(element, min(position, request.n_input - 1)).type
            kind = items.reply_type(asked, value)
            where = f"model {binding.model} output {name} (batch element {element})"
            data = items.encode_row(kind, value, binding.generic, where)
            pieces += encode_item(kind, data)
        encoded.append(pieces)
    return names, encoded


def _rows(binding: Binding, chunk: Chunk, name: str, tensor: Tensor) -> Array:
    array = tensor.array()
    if binding.stacked and (array.ndim == 0 or array.shape[0] != chunk.rows):
        raise MipError(
            ErrorCode.INTERNAL,
            f"model {binding.model} returned output {name} with shape {list(array.shape)} "
            f"for a batch of {chunk.rows}; it needs the batch as its first dimension",
        )
    return array
