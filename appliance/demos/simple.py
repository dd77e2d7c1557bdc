"""The ``simple`` family: the models Triton's example clients expect.

``simple`` adds and subtracts two INT32 [-1,16] tensors; ``simple_string``
does the same on BYTES tensors holding decimal integers; ``simple_identity``
returns its BYTES input unchanged (embedded NUL bytes included);
``simple_int8`` is ``simple`` on INT8 tensors (the sums wrap, as INT8 does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from appliance.errors import BadRequest
from appliance.model import Arrays, Model, Outputs, spec


class Simple(Model):
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)."""

    inputs = [spec("INPUT0", "INT32", [-1, 16]), spec("INPUT1", "INT32", [-1, 16])]
    outputs = [spec("OUTPUT0", "INT32", [-1, 16]), spec("OUTPUT1", "INT32", [-1, 16])]
    max_batch_size = 8

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}


class SimpleInt8(Simple):
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT8, wrapping)."""

    inputs = [spec("INPUT0", "INT8", [-1, 16]), spec("INPUT1", "INT8", [-1, 16])]
    outputs = [spec("OUTPUT0", "INT8", [-1, 16]), spec("OUTPUT1", "INT8", [-1, 16])]


class SimpleString(Model):
    """The sum and difference of decimal integers held as strings (BYTES)."""

    inputs = [spec("INPUT0", "BYTES", [-1, 16]), spec("INPUT1", "BYTES", [-1, 16])]
    outputs = [spec("OUTPUT0", "BYTES", [-1, 16]), spec("OUTPUT1", "BYTES", [-1, 16])]
    max_batch_size = 8

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        a = _integers("INPUT0", inputs["INPUT0"])
        b = _integers("INPUT1", inputs["INPUT1"])
        as_text = np.vectorize(lambda value: str(value).encode(), otypes=[object])
        return {"OUTPUT0": as_text(a + b), "OUTPUT1": as_text(a - b)}


def _integers(name: str, strings: Any) -> Any:
    try:
        return np.vectorize(int, otypes=[np.int64])(strings)
    except ValueError:
        raise BadRequest(f"{name} must hold decimal integers as strings") from None


class SimpleIdentity(Model):
    """Return the BYTES input unchanged."""

    inputs = [spec("INPUT0", "BYTES", [-1, -1])]
    outputs = [spec("OUTPUT0", "BYTES", [-1, -1])]
    max_batch_size = 8

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"OUTPUT0": inputs["INPUT0"]}
