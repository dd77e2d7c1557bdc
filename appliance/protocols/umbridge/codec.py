"""UM-Bridge JSON <-> the model's declared tensors.

A model is served over UM-Bridge when every declared input and output has a
fixed size and a numeric dtype. Then (DESIGN.md "Models")::

    UM-Bridge input vector i  <->  the model's i-th declared input, flattened
    UM-Bridge output vector j <->  the model's j-th declared output, flattened

    size = product of the declared dims, without the leading batch dim (-1)
           of a model with max_batch_size > 0; such a model gets each
           evaluation as a batch of one row.

UM-Bridge vectors are float64. A vector is converted to the declared dtype
only when every value survives exactly (an INT32 input given 1.5 is
InvalidInput); a float dtype narrower than float64 rounds to nearest but may
not overflow. Outputs are converted back to float64.

This module is pure: bytes and dicts in, numpy arrays and bytes out; its
errors are :class:`UmBridgeError`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from appliance.core.dtypes import DType, to_numpy
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import TensorSpec
from appliance.protocols.jsonbody import kind_of, load_object
from appliance.protocols.umbridge.errors import (
    UmBridgeError,
    invalid_input,
    invalid_output,
    model_not_found,
)

Vector = npt.NDArray[np.float64]

# SPEC: PROTOCOL-FACTS §5.1 — a JSON number, not the string the spec's table says.
PROTOCOL_VERSION = 1.0
_NUMBERS = frozenset((int, float))  # bool is its own type, so JSON true is refused


class Feature(enum.StrEnum):
    """The optional endpoints, as /ModelInfo names them."""

    EVALUATE = "Evaluate"
    GRADIENT = "Gradient"
    APPLY_JACOBIAN = "ApplyJacobian"
    APPLY_HESSIAN = "ApplyHessian"


# What each feature needs from the model, as ModelMetadata.supports names it.
METHODS: dict[Feature, str] = {
    Feature.EVALUATE: "predict",
    Feature.GRADIENT: "gradient",
    Feature.APPLY_JACOBIAN: "apply_jacobian",
    Feature.APPLY_HESSIAN: "apply_hessian",
}


class Unmappable(Exception):
    """A model that cannot be served over UM-Bridge; the message says why."""


@dataclass(frozen=True, slots=True)
class Interface:
    """A model as UM-Bridge sees it."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_sizes: tuple[int, ...]
    output_sizes: tuple[int, ...]
    batched: bool
    support: tuple[tuple[Feature, bool], ...]

    def supports(self, feature: Feature) -> bool:
        return dict(self.support)[feature]


def interface_of(metadata: ModelMetadata) -> Interface:
    """Map a model's declaration onto UM-Bridge vectors.

    Raises:
        Unmappable: the model is generic, not numeric, or has a free size.
    """
    if metadata.inputs is None or metadata.outputs is None:
        raise Unmappable(f"model {metadata.name} takes generic (undeclared) tensors")
    if not metadata.inputs or not metadata.outputs:
        raise Unmappable(f"model {metadata.name} declares no inputs or no outputs")
    batched = metadata.max_batch_size > 0
    return Interface(
        name=metadata.name,
        inputs=metadata.inputs,
        outputs=metadata.outputs,
        input_sizes=tuple(_size(metadata.name, spec, batched) for spec in metadata.inputs),
        output_sizes=tuple(_size(metadata.name, spec, batched) for spec in metadata.outputs),
        batched=batched,
        support=tuple(
            (feature, bool(metadata.supports.get(method))) for feature, method in METHODS.items()
        ),
    )


def _size(model: str, spec: TensorSpec, batched: bool) -> int:
    if spec.dtype is DType.BYTES:
        raise Unmappable(f"model {model} tensor {spec.name} is BYTES, not numeric")
    dims = spec.shape[1:] if batched else spec.shape
    if any(dim < 0 for dim in dims):
        raise Unmappable(
            f"model {model} tensor {spec.name} has no fixed size (shape {list(spec.shape)})"
        )
    return math.prod(dims)


# -- requests ------------------------------------------------------------------


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse a request body, whatever its Content-Type; empty means ``{}``.

    SPEC: PROTOCOL-FACTS §5.3 — the conformity suite sends JSON without a
    Content-Type, and an unsupported Evaluate with no body at all.

    Raises:
        UmBridgeError: InvalidInput, the body is not a JSON object.
    """
    return load_object(body, invalid_input, empty_is_object=True)


def read_name(request: Mapping[str, Any]) -> str | None:
    """Return the model name, or None when the request names none.

    Raises:
        UmBridgeError: ModelNotFound, ``name`` is not a string.
    """
    name = request.get("name")
    if name is None or isinstance(name, str):
        return name
    raise model_not_found(f"'name' must be a string naming a model, got {kind_of(name)}")


def read_config(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return ``config`` as request parameters (None when absent or empty).

    Raises:
        UmBridgeError: InvalidInput, config is not a JSON object.
    """
    config = request.get("config")
    if config is None:
        return None
    if not isinstance(config, dict):
        raise invalid_input(
            f"'config' must be a JSON object (it becomes the model's request parameters), "
            f"got {kind_of(config)}"
        )
    return config or None


def read_inputs(request: Mapping[str, Any], iface: Interface) -> list[Vector]:
    """Return the ``input`` vectors, checked against the model's sizes.

    Raises:
        UmBridgeError: InvalidInput, wrong count, lengths or non-numbers.
    """
    vectors = request.get("input")
    if not isinstance(vectors, list):
        raise invalid_input(
            f"'input' must be an array of {len(iface.input_sizes)} arrays of numbers, "
            f"got {kind_of(vectors)}"
        )
    check_count(iface, len(vectors))
    return [
        read_vector(vector, f"model {iface.name} input vector {i} ({spec.name})", size)
        for i, (vector, spec, size) in enumerate(
            zip(vectors, iface.inputs, iface.input_sizes, strict=True)
        )
    ]


def check_count(iface: Interface, count: int) -> None:
    if count != len(iface.input_sizes):
        raise invalid_input(
            f"model {iface.name} takes {len(iface.input_sizes)} input vector(s) "
            f"of sizes {list(iface.input_sizes)}, got {count}"
        )


def check_length(what: str, length: int, expected: int) -> None:
    if length != expected:
        raise invalid_input(f"{what} has invalid length! Expected {expected} but got {length}.")


def read_vector(value: Any, what: str, expected: int) -> Vector:
    """Return a JSON array of ``expected`` numbers as float64.

    Raises:
        UmBridgeError: InvalidInput, not an array, wrong length, non-numbers.
    """
    if not isinstance(value, list):
        raise invalid_input(f"{what} must be an array of numbers, got {kind_of(value)}")
    check_length(what, len(value), expected)
    # PERF: one C-level pass over the element types instead of a Python loop.
    if not set(map(type, value)) <= _NUMBERS:
        bad = next(item for item in value if type(item) not in _NUMBERS)
        raise invalid_input(f"{what} holds a non-number: {_short(bad)}")
    try:
        return np.array(value, dtype=np.float64)
    except OverflowError:
        raise invalid_input(f"{what} holds a number too large for float64") from None


def read_index(request: Mapping[str, Any], key: str, count: int, what: str) -> int:
    """Return an index such as ``outWrt``, in range(count).

    Raises:
        UmBridgeError: InvalidInput, missing, not an integer, out of range.
    """
    value = request.get(key)
    if type(value) is not int:
        shown = "nothing" if value is None else _short(value)
        raise invalid_input(f"'{key}' must be the integer index of {what}, got {shown}")
    if not 0 <= value < count:
        raise invalid_input(
            f"Invalid {key} index! Expected between 0 and {count - 1} ({what}), but got {value}"
        )
    return value


def to_model_inputs(iface: Interface, vectors: Sequence[Vector]) -> dict[str, npt.NDArray[Any]]:
    """Shape and convert the vectors into the model's named inputs.

    Raises:
        UmBridgeError: InvalidInput, a value does not fit the declared dtype.
    """
    inputs = {}
    for spec, vector in zip(iface.inputs, vectors, strict=True):
        dims = spec.shape[1:] if iface.batched else spec.shape
        array = cast_exact(vector, spec.dtype, f"model {iface.name} input {spec.name}")
        inputs[spec.name] = array.reshape((1, *dims) if iface.batched else dims)
    return inputs


def cast_exact(vector: Vector, dtype: DType, what: str) -> npt.NDArray[Any]:
    """Convert float64 values to ``dtype`` only where nothing is lost.

    Raises:
        UmBridgeError: InvalidInput, naming the first value that does not fit.
    """
    target = to_numpy(dtype)
    if target == vector.dtype:
        return vector
    if target.kind == "f":
        with np.errstate(over="ignore"):
            converted = vector.astype(target)
        bad = np.isinf(converted) & np.isfinite(vector)
    elif target.kind == "b":
        converted = vector.astype(target)
        bad = (vector != 0.0) & (vector != 1.0)
    else:
        bits = 8 * target.itemsize - (1 if target.kind == "i" else 0)
        low = -(2.0**bits) if target.kind == "i" else 0.0
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(vector) & (vector == np.trunc(vector)))
            bad |= (vector < low) | (vector >= 2.0**bits)
        converted = np.where(bad, 0.0, vector).astype(target)
    if bad.any():
        index = int(np.argmax(bad))
        raise invalid_input(
            f"{what} is {dtype.value}: element {index} = {float(vector[index])!r} "
            f"is not exactly representable as {dtype.value}"
        )
    return converted


# -- replies -------------------------------------------------------------------


def output_vectors(iface: Interface, outputs: Mapping[str, npt.ArrayLike]) -> list[Vector]:
    """Flatten the model's outputs into private float64 vectors, in order.

    Raises:
        UmBridgeError: InvalidOutput, an output is missing or of wrong size.
    """
    vectors = []
    for i, (spec, size) in enumerate(zip(iface.outputs, iface.output_sizes, strict=True)):
        if spec.name not in outputs:
            raise invalid_output(f"model {iface.name} did not return its output {spec.name}")
        vector = np.array(outputs[spec.name], dtype=np.float64).reshape(-1)
        if vector.size != size:
            raise invalid_output(
                f"Output vector {i} ({spec.name}) of model {iface.name} has invalid length! "
                f"Model declared {size} but returned {vector.size}."
            )
        vectors.append(vector)
    return vectors


def derivative_vector(result: npt.ArrayLike, expected: int, what: str) -> Vector:
    """Flatten a derivative result and check its length.

    Raises:
        UmBridgeError: InvalidOutput, the length is not ``expected``.
    """
    vector = np.array(result, dtype=np.float64).reshape(-1)
    if vector.size != expected:
        raise invalid_output(
            f"{what} has invalid length! Model declared {expected} but returned {vector.size}."
        )
    return vector


def encode_info(models: Sequence[str]) -> bytes:
    return orjson.dumps({"protocolVersion": PROTOCOL_VERSION, "models": list(models)})


def encode_model_info(iface: Interface) -> bytes:
    return orjson.dumps({"support": {str(feature): ok for feature, ok in iface.support}})


def encode_sizes(key: str, sizes: Sequence[int]) -> bytes:
    return orjson.dumps({key: list(sizes)})


def encode_outputs(vectors: Sequence[Vector]) -> bytes:
    """Encode ``{"output": [[...], ...]}``; NaN becomes null (JSON has no NaN)."""
    return orjson.dumps(
        {"output": [np.ascontiguousarray(v) for v in vectors]},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def encode_vector(vector: Vector) -> bytes:
    """Encode ``{"output": [...]}`` for the derivative endpoints."""
    return orjson.dumps({"output": np.ascontiguousarray(vector)}, option=orjson.OPT_SERIALIZE_NUMPY)


def _short(value: Any) -> str:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        # Nested too deeply for orjson (repr would recurse further and fail).
        text = kind_of(value)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["Feature", "Interface", "UmBridgeError", "Unmappable", "interface_of"]
