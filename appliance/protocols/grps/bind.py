"""Map a GRPS payload onto a model's inputs, and its outputs back.

Requests (DESIGN.md "Models"):

- gtensors: named tensors as they are. An unnamed gtensor takes the name of
  the model's declared input at its position; a generic model (one that
  declares no inputs, such as ``echo``) sees it as ``tensor<i>``.
- ndarray: the model's single floating-point input (cast from the JSON
  numbers to its dtype, shape checked); a generic model gets an FP32
  tensor named ``ndarray``.
- str_data / bin_data: one BYTES element. A generic model gets a tensor
  named ``str_data`` / ``bin_data`` of shape [1]; a model whose only input
  is BYTES gets it there, shaped [1, ..., 1] to the input's rank.
- gmap: one tensor per entry, of shape [1]: s_s and s_b BYTES, s_i32
  INT32, s_i64 INT64, s_f FP32, s_d FP64. A generic model sees it named
  ``<map>.<key>`` (``s_s.key``), as a key may be in several maps; for a
  model with declared inputs the key is the input's name, the shape
  [1, ..., 1] to its rank, and numbers are cast to its dtype when no value
  changes (ints to any numeric type, floats to float types).

Replies are shaped in ``reply.py``.

This module is pure: no falcon, grpc, sockets.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor, TensorSpec
from appliance.protocols.grps.errors import GrpsError, bad_request
from appliance.protocols.grps.payload import (
    MAP_DTYPES,
    Kind,
    MapField,
    Payload,
    fit_numbers,
)

FLOATS = (DType.FP16, DType.FP32, DType.FP64)
_WHAT_FEEDS = {
    Kind.NDARRAY: "ndarray feeds a model with one FP16/FP32/FP64 input",
    Kind.STR_DATA: "str_data feeds a model with one BYTES input",
    Kind.BIN_DATA: "bin_data feeds a model with one BYTES input",
}


def bind(payload: Payload, metadata: ModelMetadata) -> dict[str, Tensor]:
    """Return the model's input tensors for a payload.

    Raises:
        GrpsError: 400, the model cannot take this kind of payload.
    """
    if payload.kind is Kind.GTENSORS:
        return _bind_gtensors(payload, metadata)
    if payload.kind is Kind.NDARRAY:
        return _bind_ndarray(payload, metadata)
    if payload.kind is Kind.GMAP:
        return _bind_gmap(payload, metadata)
    return _bind_data(payload, metadata)


def _wrong_kind(metadata: ModelMetadata, kind: Kind) -> GrpsError:
    names = ", ".join(spec.name for spec in metadata.inputs or ())
    return bad_request(
        f"model {metadata.name} takes tensors {names}; send gtensors ({_WHAT_FEEDS[kind]})"
    )


def _bind_gtensors(payload: Payload, metadata: ModelMetadata) -> dict[str, Tensor]:
    declared = None if metadata.inputs is None else [spec.name for spec in metadata.inputs]
    bound: dict[str, Tensor] = {}
    for index, (name, tensor) in enumerate(payload.tensors):
        if not name and declared is None:
            name = f"tensor{index}"
        elif not name:
            if index >= len(declared or ()):
                raise bad_request(
                    f"gtensor {index} has no name and model {metadata.name} declares only "
                    f"{len(declared or ())} inputs ({', '.join(declared or ())})"
                )
            name = (declared or [])[index]
        if name in bound:
            raise bad_request(f"gtensors: more than one tensor is named {name!r}")
        bound[name] = tensor
    return bound


def _bind_ndarray(payload: Payload, metadata: ModelMetadata) -> dict[str, Tensor]:
    array = payload.array
    if array is None:
        raise bad_request("ndarray carries data only in HTTP JSON (a nested list); send gtensors")
    if metadata.inputs is None:
        return {"ndarray": Tensor.from_array(fit_numbers("ndarray", array, DType.FP32))}
    if len(metadata.inputs) != 1 or metadata.inputs[0].dtype not in FLOATS:
        raise _wrong_kind(metadata, Kind.NDARRAY)
    spec = metadata.inputs[0]
    if not spec.matches_shape(array.shape):
        raise bad_request(
            f"model {metadata.name} input {spec.name}: the ndarray's shape {list(array.shape)} "
            f"does not match the declared shape {list(spec.shape)} (-1 means any size)"
        )
    return {spec.name: Tensor.from_array(fit_numbers("ndarray", array, spec.dtype))}


def _bind_data(payload: Payload, metadata: ModelMetadata) -> dict[str, Tensor]:
    data = payload.data.encode() if isinstance(payload.data, str) else payload.data
    if metadata.inputs is None:
        return {payload.kind.value: _bytes_tensor(data, (1,))}
    specs = metadata.inputs
    if len(specs) != 1 or specs[0].dtype is not DType.BYTES or not _admits_one(specs[0]):
        raise _wrong_kind(metadata, payload.kind)
    return {specs[0].name: _bytes_tensor(data, (1,) * len(specs[0].shape))}


def _admits_one(spec: TensorSpec) -> bool:
    """Whether one element fits the declared shape (every dim -1 or 1)."""
    return all(dim in (-1, 1) for dim in spec.shape)


def _bytes_tensor(data: bytes, shape: tuple[int, ...]) -> Tensor:
    element = np.empty(1, dtype=object)
    element[0] = data
    return Tensor(DType.BYTES, shape, element.reshape(shape))


def _bind_gmap(payload: Payload, metadata: ModelMetadata) -> dict[str, Tensor]:
    bound: dict[str, Tensor] = {}
    seen: dict[str, MapField] = {}
    for map_field, entries in payload.gmap.items():
        for key, value in entries.items():
            where = f"gmap.{map_field}[{key!r}]"
            if metadata.inputs is None:
                # Generic models see "<map>.<key>": GRPS's own example clients
                # put the same key in every map.
                bound[f"{map_field}.{key}"] = _map_tensor(where, map_field, value, None)
                continue
            if key in seen:
                raise bad_request(
                    f"model {metadata.name}: gmap key {key!r} appears in both {seen[key]} and "
                    f"{map_field}, but it names one input"
                )
            seen[key] = map_field
            bound[key] = _map_tensor(where, map_field, value, metadata.input(key))
    return bound


def _map_tensor(where: str, map_field: MapField, value: Any, spec: TensorSpec | None) -> Tensor:
    dtype = MAP_DTYPES[map_field]
    shape: tuple[int, ...] = (1,)
    if spec is not None and _admits_one(spec):
        shape = (1,) * len(spec.shape)
    if dtype is DType.BYTES:
        return _bytes_tensor(dtypes.as_bytes(value), shape)
    array = np.array([value], dtype=dtypes.to_numpy(dtype))
    if spec is not None and _castable(dtype, spec.dtype):
        array = fit_numbers(where, array, spec.dtype)
    return Tensor.from_array(array.reshape(shape))


def _castable(source: DType, target: DType) -> bool:
    """Whether a map number may take a declared input's dtype unchanged."""
    if target in (DType.BYTES, DType.BOOL) or target is source:
        return False
    return target in FLOATS or source not in FLOATS


__all__ = ["bind"]
