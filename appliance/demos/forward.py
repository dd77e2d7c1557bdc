"""``forward``: UM-Bridge's own test model.

SPEC: PROTOCOL-FACTS §5.4. One input and one output of size 1; Evaluate
returns 2x, Gradient returns 2*sens; no Jacobian or Hessian action.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.model import Arrays, Model, Outputs, spec


class Forward(Model):
    """y = 2 x."""

    inputs = [spec("x", "FP64", [-1, 1])]
    outputs = [spec("y", "FP64", [-1, 1])]
    max_batch_size = 64

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"y": 2.0 * inputs["x"]}

    def gradient(
        self,
        out_wrt: str,
        in_wrt: str,
        inputs: Arrays,
        sens: npt.NDArray[np.float64],
        parameters: Mapping[str, Any],
    ) -> npt.ArrayLike:
        return 2.0 * sens
