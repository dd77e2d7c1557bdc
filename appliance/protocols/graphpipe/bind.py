"""Bind a decoded InferRequest to one model: names, types, shapes, config.

The policies, which the manual's GraphPipe page (docs/protocols/graphpipe.md) repeats for users:

- Input names. SPEC: specs/graphpipe.md §3.2.1 and PROTOCOL-FACTS §1.2 —
  an empty ``input_names`` vector, or an empty name, means "by position":
  tensor i feeds the model's i-th declared input. A model that declares no
  inputs (echo) calls them ``input0``, ``input1``, ... If names are given,
  there must be one per tensor. Every declared input needs a tensor.
- Output names. An empty vector means every output, in declared order (the
  model's own order for a generic model); an empty name at position i means
  the i-th declared output.
- Types. A tensor whose type is the declared one passes as is. Otherwise
  only these conversions are made, and only when no value changes class:
  float to float (the Python client sends Float64 for Python floats, so an
  FP32 input accepts Float64): allowed when every finite value lies within
  the target's finite range; values are rounded to the nearest target value
  (Float64 -> Float32 keeps about 7 significant digits), NaN and infinities
  stay what they are; a finite value too big for the target is refused
  (VALUE_OUT_OF_RANGE). Integer to integer (Python ints arrive as Int64):
  allowed when every value fits the target's range, refused otherwise. A
  BOOL input (GraphPipe has no Bool) accepts any integer tensor holding only
  0 and 1. Everything else (integer <-> float, String <-> numeric) is
  refused with TYPE_MISMATCH.
- config. Empty (or blank) means no parameters; text that parses as a JSON
  object becomes the request parameters; any other UTF-8 text is passed as
  the parameter ``{"config": text}``; bytes that are not UTF-8 are refused
  (BAD_CONFIG).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from appliance.core.dtypes import DType, to_numpy
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, TensorSpec
from appliance.protocols.graphpipe.codec import to_tensor
from appliance.protocols.graphpipe.errors import GraphPipeCode, GraphPipeError
from appliance.protocols.graphpipe.request import InferRequest
from appliance.protocols.graphpipe.wire import POSITIONAL_INPUT, type_name


@dataclass(frozen=True, slots=True)
class Binding:
    """What to ask the model client for."""

    inputs: dict[str, Tensor]
    outputs: list[str] | None
    parameters: dict[str, Any] | None


def bind(metadata: ModelMetadata, request: InferRequest) -> Binding:
    """Name, check and convert a request's tensors for ``metadata``'s model.

    Raises:
        GraphPipeError: with the code of the first problem found.
    """
    parameters = decode_config(request.config)
    names = _input_names(metadata, request.input_names, len(request.inputs))
    inputs = {}
    for name, wire in zip(names, request.inputs, strict=True):
        tensor = to_tensor(wire, f"model {metadata.name} input {name}")
        spec = metadata.input(name)
        inputs[name] = tensor if spec is None else conform(metadata.name, spec, tensor)
    return Binding(inputs, _output_names(metadata, request.output_names), parameters)


def decode_config(config: bytes) -> dict[str, Any] | None:
    """Turn ``InferRequest.config`` into request parameters (see the policy)."""
    try:
        text = config.decode()
    except UnicodeDecodeError:
        raise GraphPipeError(
            GraphPipeCode.BAD_CONFIG,
            f"config must be UTF-8 text (empty, a JSON object, or any text); "
            f"got {len(config)} bytes that are not",
        ) from None
    if not text.strip():
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"config": text}


def _input_names(metadata: ModelMetadata, given: list[str], count: int) -> list[str]:
    if given and len(given) != count:
        raise GraphPipeError(
            GraphPipeCode.INPUT_NAMES,
            f"model {metadata.name}: {len(given)} input_names for {count} input_tensors; "
            "give one name per tensor, or none to map them by position",
        )
    declared = None if metadata.inputs is None else [spec.name for spec in metadata.inputs]
    names: list[str] = []
    for index in range(count):
        name = given[index] if given else ""
        if not name:
            name = _positional(metadata.name, declared, index, count)
        elif declared is not None and name not in declared:
            raise GraphPipeError(
                GraphPipeCode.UNKNOWN_INPUT,
                f"model {metadata.name} has no input named {name!r}; "
                f"its inputs are {', '.join(declared)}",
            )
        if name in names:
            raise GraphPipeError(
                GraphPipeCode.INPUT_NAMES, f"model {metadata.name}: input {name!r} given twice"
            )
        names.append(name)
    missing = [name for name in declared or () if name not in names]
    if missing:
        raise GraphPipeError(
            GraphPipeCode.MISSING_INPUT,
            f"model {metadata.name}: no tensor for input {', '.join(missing)} "
            f"(it takes {', '.join(declared or ())}, in that order)",
        )
    return names


def _positional(model: str, declared: list[str] | None, index: int, count: int) -> str:
    if declared is None:
        return POSITIONAL_INPUT.format(index=index)
    if index >= len(declared):
        raise GraphPipeError(
            GraphPipeCode.INPUT_NAMES,
            f"model {model} takes {len(declared)} inputs ({', '.join(declared)}), "
            f"got {count} tensors",
        )
    return declared[index]


def _output_names(metadata: ModelMetadata, given: list[str]) -> list[str] | None:
    if not given:
        return None
    if metadata.outputs is None:
        if all(not name for name in given):
            return None
        if any(not name for name in given):
            raise GraphPipeError(
                GraphPipeCode.UNKNOWN_OUTPUT,
                f"model {metadata.name} declares no outputs, so outputs cannot be chosen by "
                "position; name them all, or none for every output",
            )
        return list(given)
    declared = [spec.name for spec in metadata.outputs]
    names = []
    for index, name in enumerate(given):
        if (not name and index >= len(declared)) or (name and name not in declared):
            shown = repr(name) if name else f"number {index} (unnamed)"
            raise GraphPipeError(
                GraphPipeCode.UNKNOWN_OUTPUT,
                f"model {metadata.name} has no output {shown}; "
                f"its outputs are {', '.join(declared)}",
            )
        names.append(name or declared[index])
    return names


def select_outputs(
    metadata: ModelMetadata, requested: list[str] | None, produced: Mapping[str, Tensor]
) -> list[Tensor]:
    """Order the model's outputs as the reply lists them.

    Raises:
        GraphPipeError: a requested output was not returned (generic models
            return whatever they compute, so a name cannot be checked before).
    """
    if requested is None:
        if metadata.outputs is None:
            return list(produced.values())
        return [produced[spec.name] for spec in metadata.outputs if spec.name in produced]
    for name in requested:
        if name not in produced:
            raise GraphPipeError(
                GraphPipeCode.UNKNOWN_OUTPUT,
                f"model {metadata.name} returned no output named {name!r}; "
                f"it returned {', '.join(produced) or 'nothing'}",
            )
    return [produced[name] for name in requested]


def conform(model: str, spec: TensorSpec, tensor: Tensor) -> Tensor:
    """Check a tensor's shape against ``spec`` and convert its type if allowed.

    Raises:
        GraphPipeError: SHAPE_MISMATCH, TYPE_MISMATCH or VALUE_OUT_OF_RANGE.
    """
    what = f"model {model} input {spec.name}"
    if not spec.matches_shape(tensor.shape):
        raise GraphPipeError(
            GraphPipeCode.SHAPE_MISMATCH,
            f"{what}: shape {list(tensor.shape)} does not match the declared "
            f"{list(spec.shape)} (-1 means any size)",
        )
    if tensor.dtype is spec.dtype:
        return tensor
    kinds = _kind(tensor.dtype), _kind(spec.dtype)
    if kinds not in (("f", "f"), ("i", "i"), ("i", "b")):
        wanted = (
            "Uint8 holding 0 or 1 (BOOL)" if spec.dtype is DType.BOOL else type_name(spec.dtype)
        )
        raise GraphPipeError(
            GraphPipeCode.TYPE_MISMATCH,
            f"{what} expects {wanted}, got {type_name(tensor.dtype)}",
        )
    array = tensor.array()
    if kinds == ("f", "f"):
        return Tensor(spec.dtype, tensor.shape, _narrow_floats(what, spec.dtype, array))
    _check_integer_range(what, spec.dtype, array)
    return Tensor(spec.dtype, tensor.shape, array.astype(to_numpy(spec.dtype)))


def _kind(dtype: DType) -> str:
    """Return "f" (float), "i" (integer), "b" (bool) or "s" (BYTES)."""
    if dtype is DType.BYTES:
        return "s"
    kind = to_numpy(dtype).kind
    return "i" if kind in "iu" else kind


def _narrow_floats(what: str, target: DType, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(over="ignore", invalid="ignore"):
        out = array.astype(to_numpy(target))
    overflowed = np.isinf(out) & np.isfinite(array)
    if overflowed.any():
        where = np.unravel_index(int(np.argmax(overflowed)), array.shape)
        largest = float(np.finfo(to_numpy(target).str).max)
        raise GraphPipeError(
            GraphPipeCode.VALUE_OUT_OF_RANGE,
            f"{what}: value {float(array[where])!r} at index {[int(i) for i in where]} does not "
            f"fit in {type_name(target)} (largest {largest:g}); send {type_name(target)} data",
        )
    return out


def _check_integer_range(what: str, target: DType, array: np.ndarray[Any, Any]) -> None:
    if not array.size:
        return
    low, high = int(array.min()), int(array.max())
    if target is DType.BOOL:
        allowed = (0, 1)
    else:
        info = np.iinfo(to_numpy(target).str)
        allowed = (int(info.min), int(info.max))
    if low < allowed[0] or high > allowed[1]:
        wanted = "BOOL (0 or 1)" if target is DType.BOOL else type_name(target)
        raise GraphPipeError(
            GraphPipeCode.VALUE_OUT_OF_RANGE,
            f"{what}: values from {low} to {high} do not all fit in {wanted} "
            f"({allowed[0]}..{allowed[1]})",
        )
