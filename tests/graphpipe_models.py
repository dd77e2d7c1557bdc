"""Models that only the GraphPipe system tests serve (no tests in here).

GraphPipe has no Bool type; ``flags`` has a BOOL input and output, so the
tests can see how BOOL travels (as Uint8 0/1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.model import Arrays, Model, Outputs, spec


class Flags(Model):
    """inverted = not flags (BOOL)."""

    inputs = [spec("flags", "BOOL", [-1])]
    outputs = [spec("inverted", "BOOL", [-1])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"inverted": ~inputs["flags"]}
