"""A model the benchmark adds to the appliance: ``identity`` with a fixed size.

UM-Bridge serves only models whose vectors have a fixed size (README,
UM-Bridge), and the demo ``identity`` takes any [-1,-1]; this one takes FP32
[1, size] (option ``size``) and returns it, so UM-Bridge rows move the same
number of values as the other protocols' identity rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.model import Arrays, Model, Outputs, spec


class FixedIdentity(Model):
    """INPUT0 FP32 [1, size] -> OUTPUT0, the same tensor."""

    def load(self) -> None:
        size = int(self.options["size"])
        self.inputs = [spec("INPUT0", "FP32", [1, size])]
        self.outputs = [spec("OUTPUT0", "FP32", [1, size])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"OUTPUT0": inputs["INPUT0"]}
