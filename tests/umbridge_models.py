"""Models served only to the UM-Bridge system tests (this module holds no tests).

Model workers import these by ``tests.umbridge_models:<Class>``,
so the module imports numpy and ``appliance.model`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.model import Arrays, Model, Outputs, spec

Vector = npt.NDArray[np.float64]

# The Jacobian blocks of Scaled, by (output, input), for scale = 1.
_BLOCKS = {
    ("u", "a"): np.eye(2),
    ("u", "b"): np.zeros((2, 3)),
    ("v", "a"): np.zeros((1, 2)),
    ("v", "b"): np.ones((1, 3)),
}


class Scaled(Model):
    """Two inputs, two outputs: u = scale * a, v = sum(b), scale from config.

    Its derivatives tell inputs and outputs apart, so a test can check that
    inWrt/outWrt reach the right declared tensors.
    """

    inputs = [spec("a", "FP64", [-1, 2]), spec("b", "FP64", [-1, 3])]
    outputs = [spec("u", "FP64", [-1, 2]), spec("v", "FP64", [-1, 1])]
    max_batch_size = 8

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        scale = float(parameters.get("scale", 1.0))
        return {"u": scale * inputs["a"], "v": inputs["b"].sum(axis=1, keepdims=True)}

    def _jacobian(self, out_wrt: str, in_wrt: str, parameters: Mapping[str, Any]) -> Vector:
        scale = float(parameters.get("scale", 1.0)) if out_wrt == "u" else 1.0
        return scale * _BLOCKS[(out_wrt, in_wrt)]

    def gradient(
        self, out_wrt: str, in_wrt: str, inputs: Arrays, sens: Vector, parameters: Any
    ) -> npt.ArrayLike:
        return np.ravel(sens) @ self._jacobian(out_wrt, in_wrt, parameters)

    def apply_jacobian(
        self, out_wrt: str, in_wrt: str, inputs: Arrays, vec: Vector, parameters: Any
    ) -> npt.ArrayLike:
        return self._jacobian(out_wrt, in_wrt, parameters) @ np.ravel(vec)

    def apply_hessian(
        self,
        out_wrt: str,
        in_wrt1: str,
        in_wrt2: str,
        inputs: Arrays,
        sens: Vector,
        vec: Vector,
        parameters: Any,
    ) -> npt.ArrayLike:
        # Linear, so zero; the length tells which input in_wrt1 named.
        return np.zeros(2 if in_wrt1 == "a" else 3)


class Typed(Model):
    """Unbatched, non-float tensors: s = column sums of m, t = count of flags."""

    inputs = [spec("m", "INT16", [2, 3]), spec("flags", "BOOL", [2])]
    outputs = [spec("s", "FP32", [3]), spec("t", "UINT8", [])]

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {
            "s": inputs["m"].sum(axis=0).astype(np.float32),
            "t": np.uint8(inputs["flags"].sum()),
        }


class Faulty(Model):
    """Misbehaves on request: wrong output sizes, wrong derivative sizes, raising."""

    inputs = [spec("x", "FP64", [-1, 2])]
    outputs = [spec("y", "FP64", [-1, 2])]
    max_batch_size = 4

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        if parameters.get("raise"):
            raise ValueError("asked to raise")
        if parameters.get("wrong"):
            return {"y": np.zeros((inputs["x"].shape[0], 3))}
        return {"y": inputs["x"]}

    def gradient(
        self, out_wrt: str, in_wrt: str, inputs: Arrays, sens: Vector, parameters: Any
    ) -> npt.ArrayLike:
        return np.zeros(5)  # input x has 2 entries

    def apply_jacobian(
        self, out_wrt: str, in_wrt: str, inputs: Arrays, vec: Vector, parameters: Any
    ) -> npt.ArrayLike:
        raise ZeroDivisionError("the Jacobian is singular here")


class Unmappable(Model):
    """A free trailing dimension: served, but not over UM-Bridge."""

    inputs = [spec("x", "FP64", [-1, -1])]
    outputs = [spec("y", "FP64", [-1, -1])]
    max_batch_size = 4

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        return {"y": inputs["x"]}
