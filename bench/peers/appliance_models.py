"""Models the benchmark adds to the appliance.

``FixedIdentity``: UM-Bridge serves only models whose vectors have a fixed
size (README, UM-Bridge), and the demo ``identity`` takes any [-1,-1]; this one
takes FP32 [1, size] (option ``size``) and returns it, so UM-Bridge rows move
the same number of values as the other protocols' identity rows.

``CallCostDigits``: the demo ``digits`` plus a fixed wait per call (option
``call_ms``), a stand-in for a model whose call costs about the same for one
row as for many (an accelerator launch, a remote backend). The digits MLP
computes in 15-60 us, less than a request's trip through a frontend, so on its
own it cannot show what batching saves a model that is the bottleneck.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy.typing as npt

from appliance.demos.digits import Digits
from appliance.model import Arrays, Model, Outputs, spec


class FixedIdentity(Model):
    """INPUT0 FP32 [1, size] -> OUTPUT0, the same tensor."""

    def load(self) -> None:
        size = int(self.options["size"])
        self.inputs = [spec("INPUT0", "FP32", [1, size])]
        self.outputs = [spec("OUTPUT0", "FP32", [1, size])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"OUTPUT0": inputs["INPUT0"]}


class CallCostDigits(Digits):
    """``digits`` that also waits ``call_ms`` per call, whatever the batch size."""

    def predict(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> Outputs:
        time.sleep(float(self.options["call_ms"]) / 1000.0)
        return super().predict(inputs, parameters)
