"""``identity``: FP32 [-1,-1] in, the same tensor out (bandwidth benchmarks).

``custom_identity_int32`` is the same on INT32, batched, as Triton's
``memory_growth_test.py`` example client expects it.

It returns its input view as is; the worker copies it once into its
response ring, so a round trip costs exactly two copies of the tensor.
Unbatched on purpose: concatenating requests would add copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.model import Arrays, Model, Outputs, spec


class Identity(Model):
    """Return INPUT0 as OUTPUT0."""

    inputs = [spec("INPUT0", "FP32", [-1, -1])]
    outputs = [spec("OUTPUT0", "FP32", [-1, -1])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"OUTPUT0": inputs["INPUT0"]}


class IdentityInt32(Identity):
    """Return INPUT0 as OUTPUT0 (INT32, batched up to 8 rows)."""

    inputs = [spec("INPUT0", "INT32", [-1, -1])]
    outputs = [spec("OUTPUT0", "INT32", [-1, -1])]
    max_batch_size = 8
