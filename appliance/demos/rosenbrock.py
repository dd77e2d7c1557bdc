"""``rosenbrock``: a nonlinear model with analytic derivatives.

f(x) = (1 - x0)^2 + 100 (x1 - x0^2)^2 for x in R^2, one output of size 1.
Gradient, Jacobian action and Hessian action are exact, so they can be
checked against finite differences.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.model import Arrays, Model, Outputs, spec

Vector = npt.NDArray[np.float64]


class Rosenbrock(Model):
    """The Rosenbrock function of two variables."""

    inputs = [spec("x", "FP64", [-1, 2])]
    outputs = [spec("f", "FP64", [-1, 1])]
    max_batch_size = 64

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        x = inputs["x"]
        x0, x1 = x[:, 0], x[:, 1]
        value = (1.0 - x0) ** 2 + 100.0 * (x1 - x0**2) ** 2
        return {"f": value.reshape(-1, 1)}

    def gradient(
        self, out_wrt: str, in_wrt: str, inputs: Arrays, sens: Vector, parameters: Mapping[str, Any]
    ) -> npt.ArrayLike:
        return float(np.ravel(sens)[0]) * _grad(_point(inputs))

    def apply_jacobian(
        self, out_wrt: str, in_wrt: str, inputs: Arrays, vec: Vector, parameters: Mapping[str, Any]
    ) -> npt.ArrayLike:
        return np.array([_grad(_point(inputs)) @ np.ravel(vec)])

    def apply_hessian(
        self,
        out_wrt: str,
        in_wrt1: str,
        in_wrt2: str,
        inputs: Arrays,
        sens: Vector,
        vec: Vector,
        parameters: Mapping[str, Any],
    ) -> npt.ArrayLike:
        return float(np.ravel(sens)[0]) * (_hessian(_point(inputs)) @ np.ravel(vec))


def _point(inputs: Arrays) -> Vector:
    return np.asarray(inputs["x"], dtype=np.float64).reshape(-1)[:2]


def _grad(x: Vector) -> Vector:
    x0, x1 = x
    return np.array([-2.0 * (1.0 - x0) - 400.0 * x0 * (x1 - x0**2), 200.0 * (x1 - x0**2)])


def _hessian(x: Vector) -> Vector:
    x0, x1 = x
    return np.array([[2.0 - 400.0 * x1 + 1200.0 * x0**2, -400.0 * x0], [-400.0 * x0, 200.0]])
