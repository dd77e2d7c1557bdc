"""Shape a model's outputs into the GRPS reply payload.

A reply takes the request's kind when the outputs fit it, else gtensors:

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

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.protocols.grps.errors import GrpsError
from appliance.protocols.grps.payload import Kind, MapField, Payload

FLOATS = (DType.FP16, DType.FP32, DType.FP64)
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
