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

Replies (:class:`ReplyShaper`) take the request's kind when the outputs fit
it, else gtensors:

- str_data / bin_data: one BYTES element, from the output named like the
  kind (``str_data``, as ``echo`` returns it) or the model's only output.
- gmap: one element per output. An output named ``<map>.<key>`` (what a
  generic model was sent) goes back to that map under that key; any other
  output keeps its name as key, in the map its request key came from, else
  the map of its dtype (BYTES s_s if UTF-8 text else s_b, integers s_i32 or
  s_i64, FP64 s_d, other floats s_f).
- ndarray: only with ``return-ndarray=true``, from the first floating-point
  output (GRPS itself asks for DT_FLOAT32 there).

For a stream, one shaper serves every part, and text (str_data, s_s) is
decoded incrementally: a UTF-8 character cut between two parts comes out
whole in the later one.

This module is pure: no falcon, grpc, sockets.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
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


# -- replies: a model's outputs into the reply payload --------------------------

_INT32 = (DType.BOOL, DType.UINT8, DType.UINT16, DType.INT8, DType.INT16, DType.INT32)
_INT64 = (DType.UINT32, DType.UINT64, DType.INT64)
_MAPS = {map_field.value: map_field for map_field in MapField}
Entry = tuple[MapField, str, Any]


class ReplyShaper:
    """Turn model outputs into the reply payload for one request."""

    def __init__(self, request: Payload, want_ndarray: bool = False) -> None:
        self.kind = request.kind
        self.want_ndarray = want_ndarray
        self.hints = {key: field for field, entries in request.gmap.items() for key in entries}
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def shape(self, outputs: Mapping[str, Tensor], final: bool = True) -> Payload:
        """Return the reply payload for ``outputs`` (views; encode it at once).

        Raises:
            GrpsError: 500, text that is not UTF-8, or no float for ndarray.
        """
        if self.want_ndarray:
            return _as_ndarray(outputs)
        if self.kind in (Kind.STR_DATA, Kind.BIN_DATA):
            element = _single_element(self.kind, outputs)
            if element is not None and self.kind is Kind.BIN_DATA:
                return Payload(Kind.BIN_DATA, data=element)
            if element is not None:
                return Payload(Kind.STR_DATA, data=self._text("str_data", element, final))
        elif self.kind is Kind.GMAP:
            gmap = self._gmap(outputs, final)
            if gmap is not None:
                return Payload(Kind.GMAP, gmap=gmap)
        return Payload(Kind.GTENSORS, tensors=list(outputs.items()))

    def finish(self) -> None:
        """Check that a stream's text did not end inside a UTF-8 character.

        Raises:
            GrpsError: 500, streamed text was not UTF-8.
        """
        for name in list(self._decoders):
            self._text(name, b"", final=True)

    def _gmap(self, outputs: Mapping[str, Tensor], final: bool) -> dict[MapField, Any] | None:
        """Return the outputs as map entries, or None if one is not a single value."""
        gmap: dict[MapField, dict[str, Any]] = {}
        for name, tensor in outputs.items():
            if tensor.element_count == 0:
                continue  # a stream part without this entry
            if tensor.element_count != 1:
                return None
            entry = _entry(name, tensor, self.hints.get(name))
            if entry is None:
                return None
            map_field, key, value = entry
            if map_field is MapField.S_S:
                value = self._text(name, dtypes.as_bytes(value), final)
            elif map_field is MapField.S_B:
                value = dtypes.as_bytes(value)
            else:
                value = value.item()
            gmap.setdefault(map_field, {})[key] = value
        return gmap

    def _text(self, name: str, data: bytes, final: bool) -> str:
        decoder = self._decoders.get(name)
        if decoder is None:
            decoder = self._decoders[name] = codecs.getincrementaldecoder("utf-8")()
        try:
            text: str = decoder.decode(data, final)
        except UnicodeDecodeError as ex:
            decoder.reset()
            raise GrpsError(
                500,
                f"the model's output {name} is not UTF-8 text ({ex.reason}); "
                "GRPS strings carry text only, so send bytes as bin_data or s_b",
            ) from None
        return text


def _single_element(kind: Kind, outputs: Mapping[str, Tensor]) -> bytes | None:
    tensor = outputs.get(kind.value)
    if tensor is None and len(outputs) == 1:
        tensor = next(iter(outputs.values()))
    if tensor is None or tensor.dtype is not DType.BYTES or tensor.element_count != 1:
        return None
    return dtypes.as_bytes(tensor.array().reshape(-1)[0])


def _as_ndarray(outputs: Mapping[str, Tensor]) -> Payload:
    for tensor in outputs.values():
        if tensor.dtype in FLOATS:
            return Payload(Kind.NDARRAY, array=tensor.array())
    found = ", ".join(f"{name} {t.dtype.value}" for name, t in outputs.items()) or "none"
    raise GrpsError(
        500,
        f"return-ndarray=true needs a floating-point output, but the model returned {found}; "
        "ask without return-ndarray to get gtensors",
    )


def _entry(name: str, tensor: Tensor, hint: MapField | None) -> Entry | None:
    value = tensor.array().reshape(-1)[0]
    prefix, dot, key = name.partition(".")
    if dot and prefix in _MAPS and _fits(_MAPS[prefix], tensor.dtype, value):
        return _MAPS[prefix], key, value
    if hint is not None and _fits(hint, tensor.dtype, value):
        return hint, name, value
    map_field = _by_dtype(tensor.dtype, value)
    return None if map_field is None else (map_field, name, value)


def _fits(map_field: MapField, dtype: DType, value: Any) -> bool:
    if map_field in (MapField.S_S, MapField.S_B):
        return dtype is DType.BYTES
    if map_field in (MapField.S_F, MapField.S_D):
        return dtype in FLOATS
    if dtype not in _INT32 + _INT64:
        return False
    limit = 1 << 31 if map_field is MapField.S_I32 else 1 << 63
    return -limit <= int(value) < limit


def _by_dtype(dtype: DType, value: Any) -> MapField | None:
    if dtype is DType.BYTES:
        return MapField.S_S if _is_text(dtypes.as_bytes(value)) else MapField.S_B
    if dtype in FLOATS:
        return MapField.S_D if dtype is DType.FP64 else MapField.S_F
    if dtype in _INT32:
        return MapField.S_I32
    if dtype in _INT64 and int(value) < 1 << 63:
        return MapField.S_I64
    return None


def _is_text(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


__all__ = ["ReplyShaper"]
