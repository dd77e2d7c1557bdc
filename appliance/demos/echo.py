"""``echo``: returns whatever tensors it is sent, for generic payloads.

It declares no inputs or outputs, so any named tensors are accepted:
strings, bytes, maps (as a protocol encodes them) and numeric tensors come
back exactly as sent. Its streaming form sends the payload back in
``chunks`` parts (an option, 3 by default): part k holds, for every tensor,
its k-th piece along the first axis, and a single BYTES element is cut into
pieces of bytes, so joining the parts gives the payload back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from appliance.model import Arrays, Model, Outputs


class Echo(Model):
    """Return the request's tensors unchanged."""

    inputs = None
    outputs = None

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return dict(inputs)

    def predict_stream(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Iterator[Outputs]:
        chunks = max(1, int(parameters.get("chunks", self.options.get("chunks", 3))))
        delay_s = float(parameters.get("chunk_delay_s", self.options.get("chunk_delay_s", 0.0)))
        pieces = {name: _split(array, chunks) for name, array in inputs.items()}
        for index in range(chunks):
            if index and delay_s:
                time.sleep(delay_s)
            part = {name: parts[index] for name, parts in pieces.items()}
            yield {name: piece for name, piece in part.items() if piece is not None}


def _split(array: Any, chunks: int) -> list[Any]:
    """Cut one tensor into ``chunks`` pieces; None where a part has none."""
    if array.dtype == object and array.size == 1:
        data = bytes(array.reshape(-1)[0])
        size = -(-len(data) // chunks) if data else 0
        cuts = [data[i * size : (i + 1) * size] for i in range(chunks)]
        return [np.array([cut], dtype=object).reshape(array.shape) for cut in cuts]
    if array.ndim == 0:
        # A scalar cannot be cut: it travels whole in the first part.
        return [array] + [None] * (chunks - 1)
    return list(np.array_split(array, chunks))
