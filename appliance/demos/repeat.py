"""``repeat_int32``: Triton's decoupled example model (its ``repeat`` backend).

One request carries IN (INT32 [n]), DELAY (UINT32 [n], milliseconds) and
WAIT (UINT32 [1], milliseconds). The model answers with n responses: the
i-th, sent DELAY[i] ms after the one before, holds OUT = [IN[i]] and
IDX = [i]. After the last it waits WAIT ms before the stream ends (Triton's
backend holds the request that long before releasing it). Zero elements
mean zero responses.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from appliance.errors import BadRequest
from appliance.model import Arrays, Model, Outputs, spec


class RepeatInt32(Model):
    """Send IN back one element per response, each after its DELAY."""

    inputs = [
        spec("IN", "INT32", [-1]),
        spec("DELAY", "UINT32", [-1]),
        spec("WAIT", "UINT32", [1]),
    ]
    outputs = [spec("OUT", "INT32", [1]), spec("IDX", "UINT32", [1])]

    def predict_stream(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Iterator[Outputs]:
        values, delays = inputs["IN"], inputs["DELAY"]
        if values.shape != delays.shape:
            raise BadRequest(
                f"IN and DELAY must have the same shape, got {list(values.shape)} and "
                f"{list(delays.shape)}"
            )
        for index, (value, delay_ms) in enumerate(zip(values, delays, strict=True)):
            time.sleep(int(delay_ms) / 1000.0)
            yield {
                "OUT": np.array([value], dtype=np.int32),
                "IDX": np.array([index], dtype=np.uint32),
            }
        time.sleep(int(inputs["WAIT"][0]) / 1000.0)
