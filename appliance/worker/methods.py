"""Requests that are not batched predictions: derivatives and stream parts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from appliance.core.metadata import ModelMetadata
from appliance.core.output_parameters import carried
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest, ModelFailed, Unsupported
from appliance.model import Model
from appliance.worker.batcher import SENS, VEC, conform
from appliance.worker.pending import Pending

DERIVATIVE_OUTPUT = "output"


def derivative(model: Model, metadata: ModelMetadata, pending: Pending) -> dict[str, Tensor]:
    """Run a gradient, Jacobian action or Hessian action request.

    The request's ``args`` name the output and input(s) to differentiate;
    ``__sens__`` and ``__vec__`` tensors carry the sensitivity and direction.

    Raises:
        Unsupported: the model does not implement the method.
        BadRequest: an argument or vector is missing or names nothing.
    """
    method = pending.method
    if not metadata.supports.get(method):
        raise Unsupported(f"model {metadata.name} does not implement {method}")
    args = pending.message.body.get("args") or {}
    arrays = pending.arrays
    inputs = {name: array for name, array in arrays.items() if name not in (SENS, VEC)}
    out_wrt = _name(metadata, args, "out_wrt", outputs=True)
    params = pending.parameters
    if method == "gradient":
        in_wrt = _name(metadata, args, "in_wrt")
        result = model.gradient(out_wrt, in_wrt, inputs, _vector(arrays, SENS), params)
    elif method == "apply_jacobian":
        in_wrt = _name(metadata, args, "in_wrt")
        result = model.apply_jacobian(out_wrt, in_wrt, inputs, _vector(arrays, VEC), params)
    else:
        in1, in2 = _name(metadata, args, "in_wrt1"), _name(metadata, args, "in_wrt2")
        sens, vec = _vector(arrays, SENS), _vector(arrays, VEC)
        result = model.apply_hessian(out_wrt, in1, in2, inputs, sens, vec, params)
    try:
        output = np.asarray(result, dtype=np.float64)
    except (TypeError, ValueError) as ex:
        raise ModelFailed(f"model {metadata.name} {method} returned no numbers: {ex}") from None
    return {DERIVATIVE_OUTPUT: Tensor.from_array(output)}


def _name(metadata: ModelMetadata, args: Mapping[str, Any], key: str, outputs: bool = False) -> str:
    value = args.get(key)
    specs = metadata.outputs if outputs else metadata.inputs
    names = [spec.name for spec in specs or ()]
    if not isinstance(value, str) or (specs is not None and value not in names):
        kind = "output" if outputs else "input"
        raise BadRequest(
            f"{key} must name an {kind} of model {metadata.name} ({', '.join(names)}), "
            f"got {value!r}"
        )
    return value


def _vector(arrays: Mapping[str, Any], name: str) -> Any:
    if name not in arrays:
        raise BadRequest(f"the request has no {name.strip('_')} vector")
    return np.asarray(arrays[name], dtype=np.float64)


def stream_part(metadata: ModelMetadata, part: Any) -> dict[str, Tensor]:
    """Check one streamed part: any subset of the declared outputs (and their
    parameters, from an OutputsWithParameters).

    Raises:
        ModelFailed: the part is not a mapping or holds an unknown output.
    """
    if not isinstance(part, Mapping):
        raise ModelFailed(
            f"model {metadata.name} streamed {type(part).__name__}, expected a mapping of "
            "output names to arrays"
        )
    tensors = {}
    for name, value in part.items():
        spec = metadata.output(str(name))
        if metadata.outputs is None:
            array = np.asarray(value)
        elif spec is None:
            raise ModelFailed(f"model {metadata.name} streamed an undeclared output {name!r}")
        else:
            array = conform(metadata.name, spec, value)
        tensors[str(name)] = Tensor.from_array(array)
    return carried(part, tensors)
