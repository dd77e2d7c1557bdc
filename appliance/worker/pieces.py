"""A prediction with more rows than ``max_batch_size``, served in pieces.

The worker cuts such a request into pieces of at most ``max_batch_size``
rows, each a view of the request's input arrays (no copy). The pieces ride
the batcher like any other request, so they share batches with other
requests and never hand the model more rows than it declared. Once the last
piece is answered, the pieces' outputs are joined in order into the
request's one reply; the first piece that fails fails the whole request.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core.tensor import Tensor
from appliance.worker.pending import Pending, Whole

Array = npt.NDArray[Any]


def pieces_needed(rows: int, max_rows: int) -> int:
    return -(-rows // max_rows)


def cut(pending: Pending, max_rows: int) -> list[Pending]:
    """Cut ``pending`` into pieces of at most ``max_rows`` rows, in order."""
    count = pieces_needed(pending.rows, max_rows)
    whole = Whole(pending, [None] * count, count)
    pieces = []
    for index in range(count):
        start = index * max_rows
        stop = min(start + max_rows, pending.rows)
        arrays = {
            name: array[start:stop] if array.ndim > 0 else array
            for name, array in pending.arrays.items()
        }
        piece = Pending(
            pending.message,
            arrays,
            pending.method,
            pending.parameters,
            pending.outputs,
            stop - start,
            pending.key,
            pending.arrived,
        )
        piece.whole = whole
        piece.index = index
        pieces.append(piece)
    return pieces


def answered(piece: Pending, outputs: dict[str, Tensor]) -> dict[str, Tensor] | None:
    """Keep a piece's outputs; return the joined outputs once every piece has some."""
    whole = piece.whole
    assert whole is not None
    whole.parts[piece.index] = outputs
    whole.left -= 1
    if whole.left:
        return None
    parts = [part for part in whole.parts if part is not None]
    whole.parts = []
    return {
        name: Tensor.from_array(np.concatenate([part[name].array() for part in parts]))
        for name in parts[0]
    }
