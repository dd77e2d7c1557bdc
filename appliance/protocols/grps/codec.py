"""GRPS over HTTP: JSON bodies <-> payloads, and the JSON replies.

SPEC: grps.md "RESTful接口" and PROTOCOL-FACTS §3.2. A request body is a
GrpsMessage in proto3 JSON with one of ``str_data``, ``gtensors``,
``ndarray`` (a nested list of numbers, an HTTP-only convention), ``gmap``
or ``bin_data`` (base64; GRPS clients send bin_data as an
application/octet-stream body instead, see ``rest.py``). Keys may be
snake_case or camelCase, enums names or numbers, int64 values numbers or
strings, as protobuf's JSON parser allows. Unknown keys are ignored as GRPS
does, but the documentation's ``flat_double`` is read as ``flat_float64``
(GRPS itself drops it silently, leaving the tensor without data).

Replies are rendered as GRPS renders them (protobuf's MessageToJson with
proto field names): snake_case keys, enum names, int64 as strings, bytes
as base64, NaN/Infinity as strings, default values left out. Tensors are
rendered straight from numpy with orjson rather than through protobuf
messages (PERF: the unit tests check both give the same JSON).

This module is pure: no falcon, grpc, sockets.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
from google.protobuf import json_format

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.protocols.grps.errors import OK, GrpsError, bad_request
from appliance.protocols.grps.payload import (
    FLAT_FIELDS,
    GRPS_TYPES,
    TYPE_OF_FIELD,
    GrpsType,
    Kind,
    Payload,
    check_shape,
    numbers_to_array,
    output_type,
    parse_grps_type,
    strings_to_array,
    tensor_from_flat,
    text_elements,
)
from appliance.protocols.grps.pbcodec import decode_gmap, encode_gmap, grps_pb2
from appliance.protocols.jsonbody import kind_of, load_object

JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
# SPEC: PROTOCOL-FACTS §3.2 — the Content-Type GRPS's Python server replies with.
REPLY_TYPE = "application/json;charset=utf-8"

# Each payload key, snake_case and camelCase (protobuf's JSON names).
_KIND_KEYS: dict[str, Kind] = {kind.value: kind for kind in Kind} | {
    "binData": Kind.BIN_DATA,
    "strData": Kind.STR_DATA,
}
_FLAT_KEYS: dict[str, str] = {flat: flat for flat in FLAT_FIELDS} | {
    "".join(p if i == 0 else p.title() for i, p in enumerate(flat.split("_"))): flat
    for flat in FLAT_FIELDS
}
# SPEC: grps.md "gtensors" shows "flat_double", a name grps.proto lacks.
_FLAT_KEYS["flat_double"] = "flat_float64"
_FLAT_KEYS["flatDouble"] = "flat_float64"
NO_PAYLOAD = (
    "the request carries no data: send one of str_data, gtensors, ndarray or gmap as JSON, "
    "or the raw bytes as an application/octet-stream body (bin_data)"
)
_STATUS_NAMES = {1: "SUCCESS", 2: "FAILURE"}


def decode_json_request(body: bytes) -> Payload:
    """Decode a JSON GrpsMessage into a payload.

    Raises:
        GrpsError: 400, the body is not a GrpsMessage with exactly one payload.
    """
    doc = load_object(body, bad_request, what="the body (a GrpsMessage)")
    model = doc.get("model") or ""
    if not isinstance(model, str):
        raise bad_request(f'model must be a string such as "name" or "name-1", not {model!r}')
    present = [key for key in doc if key in _KIND_KEYS and doc[key] is not None]
    if not present:
        raise bad_request(NO_PAYLOAD)
    if len(present) > 1:
        raise bad_request(f"a GrpsMessage carries one payload, but this one has {present}")
    payload = _decode_payload(_KIND_KEYS[present[0]], doc[present[0]])
    payload.model = model
    return payload


def _decode_payload(kind: Kind, value: Any) -> Payload:
    if kind is Kind.STR_DATA:
        if not isinstance(value, str):
            raise bad_request(f"str_data must be a string, not {kind_of(value)}")
        return Payload(kind, data=value)
    if kind is Kind.BIN_DATA:
        return Payload(kind, data=_base64(value))
    if kind is Kind.NDARRAY:
        return Payload(kind, array=decode_ndarray(value))
    if kind is Kind.GMAP:
        if not isinstance(value, dict):
            raise bad_request("gmap must be an object of typed maps (s_s, s_b, s_i32, ...)")
        try:
            # SPEC: GRPS parses with ignore_unknown_fields; its example HTTP
            # client sends an "s_t" map that grps.proto does not have.
            message = json_format.ParseDict(
                value, grps_pb2.GenericMapData(), ignore_unknown_fields=True
            )
        except (json_format.ParseError, TypeError, ValueError) as ex:
            raise bad_request(f"gmap: {ex}") from None
        return Payload(kind, gmap=decode_gmap(message))
    return Payload(kind, tensors=decode_gtensors(value))


def _base64(value: object) -> bytes:
    if not isinstance(value, str):
        raise bad_request("bin_data in JSON must be a base64 string")
    text = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except ValueError:  # binascii.Error, or a character beyond ASCII
        raise bad_request("bin_data is not valid base64") from None


def decode_ndarray(value: object) -> np.ndarray[Any, Any]:
    """Return the nested list of numbers as a float64 array."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        raise bad_request(
            "ndarray must be a rectangular nested list of numbers (rows of equal length)"
        ) from None
    if array.dtype.kind not in "iuf":
        raise bad_request("ndarray must be a rectangular nested list of numbers only")
    try:
        return array.astype(np.float64)
    except OverflowError:
        raise bad_request("ndarray holds a number too large for a float") from None


def decode_gtensors(value: object) -> list[tuple[str, Tensor]]:
    """Decode ``{"tensors": [GenericTensor, ...]}``."""
    if not isinstance(value, dict):
        raise bad_request('gtensors must be an object {"tensors": [...]}')
    tensors = value.get("tensors") or []
    if not isinstance(tensors, list):
        raise bad_request("gtensors.tensors must be a list of GenericTensor objects")
    if not tensors:
        raise bad_request("gtensors holds no tensors")
    return [_decode_tensor(index, doc) for index, doc in enumerate(tensors)]


def _decode_tensor(index: int, doc: object) -> tuple[str, Tensor]:
    where = f"gtensors.tensors[{index}]"
    if not isinstance(doc, dict):
        raise bad_request(f"{where} must be a GenericTensor object")
    name = doc.get("name") or ""
    if not isinstance(name, str):
        raise bad_request(f"{where}.name must be a string")
    where = f"{where} ({name})" if name else where
    flats: dict[str, object] = {}
    for key, values in doc.items():
        flat = _FLAT_KEYS.get(key)
        if flat is not None and values not in (None, []):
            if flat in flats:
                raise bad_request(f"{where}: {flat} is given twice (as {key} too)")
            flats[flat] = values
    grps_type = _tensor_type(where, doc.get("dtype"), flats)
    expected = GRPS_TYPES[grps_type][1]
    others = sorted(set(flats) - {expected})
    if others:
        raise bad_request(
            f"{where}: dtype {grps_type.name} carries its data in {expected}, "
            f"but {', '.join(others)} is set"
        )
    shape = doc.get("shape")
    dims = None if shape is None else check_shape(where, shape)
    values = flats.get(expected, [])
    if grps_type is GrpsType.DT_STRING:
        array = strings_to_array(f"{where}.{expected}", values)
    else:
        array = numbers_to_array(f"{where}.{expected}", values, GRPS_TYPES[grps_type][0])
    return name, tensor_from_flat(where, grps_type, dims, array)


def _tensor_type(where: str, dtype: object, flats: dict[str, object]) -> GrpsType:
    """Return the tensor's type; without one, that of its only data field."""
    if dtype not in (None, 0, "DT_INVALID"):
        return parse_grps_type(dtype, where)
    if len(flats) == 1:
        return TYPE_OF_FIELD[next(iter(flats))]
    raise bad_request(f"{where}: no dtype (DT_FLOAT32, ...) and no single flat_* field to infer it")


# -- replies ----------------------------------------------------------------


def status_json(code: int = OK, message: str = "OK") -> dict[str, Any]:
    status: dict[str, Any] = {"code": code} if code else {}
    if message:
        status["msg"] = message
    status["status"] = "SUCCESS" if code == OK else "FAILURE"
    return status


def encode_error(error: GrpsError) -> bytes:
    return orjson.dumps({"status": status_json(error.code, error.message)})


def encode_status(code: int = OK, message: str = "OK", str_data: str | None = None) -> bytes:
    """Return a reply with a status and optionally str_data (health, metadata)."""
    doc: dict[str, Any] = {"status": status_json(code, message)}
    if str_data is not None:
        doc["str_data"] = str_data
    return orjson.dumps(doc)


def encode_json_reply(payload: Payload) -> bytes:
    """Return a successful reply as GRPS's JSON.

    Raises:
        GrpsError: 500, an output cannot be expressed in GRPS's types.
    """
    doc: dict[str, Any] = {"status": status_json()}
    kind = payload.kind
    if kind is Kind.STR_DATA:
        doc["str_data"] = payload.data
    elif kind is Kind.BIN_DATA:
        assert isinstance(payload.data, bytes)
        doc["bin_data"] = base64.b64encode(payload.data).decode()
    elif kind is Kind.NDARRAY:
        assert payload.array is not None
        doc["ndarray"] = _floats(payload.array)
    elif kind is Kind.GMAP:
        doc["gmap"] = json_format.MessageToDict(
            encode_gmap(payload.gmap), preserving_proto_field_name=True
        )
    else:
        doc["gtensors"] = {"tensors": [_tensor_json(name, t) for name, t in payload.tensors]}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _tensor_json(name: str, tensor: Tensor) -> dict[str, Any]:
    grps_type = output_type(tensor.dtype)
    doc: dict[str, Any] = {"name": name} if name else {}
    doc["dtype"] = grps_type.name
    if tensor.shape:
        doc["shape"] = list(tensor.shape)
    if tensor.element_count:
        doc[GRPS_TYPES[grps_type][1]] = _flat_values(name, tensor, grps_type)
    return doc


def _flat_values(name: str, tensor: Tensor, grps_type: GrpsType) -> Any:
    if grps_type is GrpsType.DT_STRING:
        return text_elements(f"output {name}", tensor.array())
    flat = np.ascontiguousarray(tensor.array().reshape(-1))
    if grps_type is GrpsType.DT_INT64:
        if tensor.dtype is DType.UINT64 and flat.size and int(flat.max()) >= 1 << 63:
            raise GrpsError(500, f"output {name}: a UINT64 value exceeds GRPS's DT_INT64 range")
        # proto3 JSON writes 64-bit integers as strings.
        return [str(value) for value in flat.tolist()]
    if grps_type in (GrpsType.DT_FLOAT16, GrpsType.DT_FLOAT32, GrpsType.DT_FLOAT64):
        return _floats(flat)
    if tensor.dtype in (DType.BOOL, DType.UINT16):
        # The appliance types GRPS lacks go out in the next wider one.
        return flat.astype(dtypes.to_numpy(GRPS_TYPES[grps_type][0]))
    return flat


def _floats(array: np.ndarray[Any, Any]) -> Any:
    """Return floats for orjson; NaN and infinities as proto3 JSON strings."""
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    array = np.ascontiguousarray(array)
    if np.all(np.isfinite(array)):
        return array
    if array.ndim == 0:
        return _special(array[()])
    return [_floats(row) if row.ndim else _special(row) for row in array]


def _special(value: Any) -> float | str:
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    # str() of a numpy float is its shortest repr for its own precision.
    return float(str(value))


__all__ = [
    "BINARY_TYPE",
    "JSON_TYPE",
    "NO_PAYLOAD",
    "REPLY_TYPE",
    "decode_json_request",
    "encode_error",
    "encode_json_reply",
    "encode_status",
]
