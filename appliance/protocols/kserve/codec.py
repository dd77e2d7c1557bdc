"""KServe v2 REST bodies: JSON tensors and the binary tensor data extension.

Pure: bytes and parsed header values in, :class:`InferRequest` out; outputs
in, body bytes out. No web framework, sockets or shared memory here.

Body of an inference request or response (SPEC: PROTOCOL-FACTS §2.3)::

    +--------------------------------+----------+----------+-----+
    | JSON header                    | blob 0   | blob 1   | ... |
    | (Inference-Header-Content-     | (binary_data_size bytes each, in the
    |  Length bytes when blobs follow)|  order the tensors appear in the JSON)
    +--------------------------------+----------+----------+-----+

Numeric blobs are row-major little-endian without padding; a BYTES blob is,
per element, a uint32 LE length then the bytes. JSON ``data`` may be nested
or flat; BYTES travel in JSON as strings (UTF-8).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import orjson

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.protocols.jsonbody import load_object
from appliance.protocols.kserve.errors import DecodeError
from appliance.protocols.kserve.inference import (
    InferRequest,
    InputTensor,
    OutputData,
    RequestedOutput,
    check_unique,
    parse_dtype,
    parse_shape,
    shm_ref,
    tensor_from_buffer,
    with_input_parameters,
)
from appliance.protocols.kserve.response_outputs import response_parameters

# Numpy kinds JSON values may arrive as, for each kind of target dtype.
_JSON_KINDS = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}
# The float dtypes a JSON number (a float64 or an int64) can overflow, and their largest values.
_FLOAT_MAX = {np.dtype(t): float(np.finfo(t).max) for t in (np.float16, np.float32)}
_INT64_MAX = float(np.iinfo(np.int64).max)
# PERF: up to this many elements, a range check goes over a list of Python numbers:
# numpy's min() and max() cost 2-5 µs each in call overhead alone, for a tensor of 4.
_SMALL = 64


# -- requests ----------------------------------------------------------------


def decode_infer_request(
    body: bytes | memoryview, header_length: int | None, model: str, version: str = ""
) -> InferRequest:
    """Decode an inference request body (already decompressed).

    Args:
        body: the whole body.
        header_length: Inference-Header-Content-Length, None when absent.
        model: the model named in the URL.
        version: the version named in the URL, "" when none.

    Raises:
        DecodeError: malformed JSON, tensors or binary layout.
    """
    view = memoryview(body).cast("B")
    if header_length is None:
        header, binary = view, view[0:0]
    else:
        if not 0 <= header_length <= len(view):
            raise DecodeError(
                f"Inference-Header-Content-Length {header_length} does not fit the "
                f"{len(view)} byte body"
            )
        header, binary = view[:header_length], view[header_length:]
    doc = load_object(header, DecodeError)
    parameters = _parameters(doc.get("parameters"), "request")
    inputs = _decode_inputs(doc.get("inputs"), binary)
    outputs = _decode_outputs(doc.get("outputs"))
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise DecodeError(f"request id must be a string, got {request_id!r}")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise DecodeError(f"parameter binary_data_output must be a boolean, got {binary_output!r}")
    per_input = [(item["name"], item.get("parameters") or {}) for item in doc["inputs"]]
    parameters = with_input_parameters(parameters, per_input)
    return InferRequest(model, version, request_id, parameters, inputs, outputs, binary_output)


def _parameters(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DecodeError(f"{what} parameters must be a JSON object")
    return value


def _decode_inputs(items: object, binary: memoryview) -> list[InputTensor]:
    if not isinstance(items, list):
        raise DecodeError('the request needs "inputs": a list of tensors')
    inputs = []
    cursor = 0
    for item in items:
        tensor, cursor = _decode_input(item, binary, cursor)
        inputs.append(tensor)
    if cursor != len(binary):
        raise DecodeError(
            f"{len(binary)} bytes of binary data follow the JSON header but the inputs' "
            f"binary_data_size add up to {cursor}"
        )
    check_unique([tensor.name for tensor in inputs], "input")
    return inputs


def _decode_input(item: object, binary: memoryview, cursor: int) -> tuple[InputTensor, int]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise DecodeError("every input must be a JSON object with a name")
    name = item["name"]
    what = f"input {name}"
    dtype = parse_dtype(item.get("datatype"), what)
    shape = parse_shape(item.get("shape"), what)
    params = _parameters(item.get("parameters"), what)
    shm = shm_ref(params, what)
    size = params.get("binary_data_size")
    given = [k for k, v in (("data", "data" in item), ("binary_data_size", size is not None)) if v]
    if shm is not None:
        if given:
            raise DecodeError(f"{what} is in shared memory and must not also carry {given[0]}")
        return InputTensor(name, dtype, shape, shm=shm), cursor
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise DecodeError(f"{what}: binary_data_size must be an integer >= 0, got {size!r}")
        if cursor + size > len(binary):
            raise DecodeError(
                f"{what}: binary_data_size {size} exceeds the {len(binary) - cursor} bytes of "
                "binary data left in the body"
            )
        buffer = binary[cursor : cursor + size]
        return InputTensor(name, dtype, shape, tensor_from_buffer(name, dtype, shape, buffer)), (
            cursor + size
        )
    if "data" not in item:
        raise DecodeError(f"{what} has no data, binary_data_size or shared memory")
    return InputTensor(name, dtype, shape, tensor_from_json(name, dtype, shape, item["data"])), (
        cursor
    )


def tensor_from_json(name: str, dtype: DType, shape: tuple[int, ...], data: object) -> Tensor:
    """Build a tensor from JSON ``data`` (nested or flat, row-major).

    Raises:
        DecodeError: wrong element types, ragged lists, out-of-range values,
            or an element count that does not match the shape.
    """
    what = f"input {name}"
    count = dtypes.element_count(shape)
    if dtype is DType.BYTES:
        flat = flatten(data, what)
        if len(flat) != count:
            raise DecodeError(_count_message(what, len(flat), shape, count))
        array = np.empty(count, dtype=object)
        array[:] = [_utf8(what, element) for element in flat]
        return Tensor(dtype, shape, array.reshape(shape))
    try:
        array = np.asarray(data)
    except (ValueError, TypeError):
        raise DecodeError(f"{what}: data must be a (nested) list of numbers") from None
    target = dtypes.to_numpy(dtype)
    kind = array.dtype.kind
    if target.kind in "iu" and kind in "fO":
        # numpy reads integers beyond int64 as float64 (losing digits) or
        # object: convert the JSON values themselves.
        array = _exact_integers(what, dtype, flatten(data, what))
    elif array.size and kind not in _JSON_KINDS[target.kind]:
        kinds = "booleans" if target.kind == "b" else "numbers"
        raise DecodeError(f"{what}: {dtype.value} data must be JSON {kinds}")
    if array.size != count:
        raise DecodeError(_count_message(what, array.size, shape, count))
    _check_range(what, dtype, array)
    if _may_overflow(target, array):
        with np.errstate(over="ignore"):
            converted = array.astype(target)
        if np.any(np.isinf(converted) & np.isfinite(array)):
            # Refused rather than turned into infinity, as every other protocol here does.
            raise DecodeError(f"{what}: a value is too large for {dtype.value}")
    else:
        converted = array.astype(target)
    return Tensor(dtype, shape, converted.reshape(shape))


def _may_overflow(target: np.dtype[Any], array: np.ndarray[Any, Any]) -> bool:
    """Whether casting ``array`` to the float ``target`` could make an infinity.

    PERF: asked first, so the common request (values within range) casts
    without numpy's error-state context and an any() over the result, which
    were most of this codec's time for a small tensor.
    """
    largest = _FLOAT_MAX.get(target)
    if largest is None or not array.size:
        return False
    kind = array.dtype.kind
    if kind == "f" or (kind in "iu" and largest < _INT64_MAX):
        if array.size <= _SMALL:
            return any(abs(value) > largest for value in array.ravel().tolist())
        # Not max() and min(): a NaN anywhere makes those NaN, hiding a value out of range.
        return bool(np.any(np.abs(array) > largest))
    return False


def _exact_integers(what: str, dtype: DType, flat: list[object]) -> np.ndarray[Any, Any]:
    values = []
    for value in flat:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise DecodeError(f"{what}: {dtype.value} data must be whole JSON numbers")
        values.append(value)
    try:
        return np.array(values, dtype=dtypes.to_numpy(dtype))
    except OverflowError:
        raise DecodeError(f"{what}: a value does not fit {dtype.value}") from None


def _utf8(what: str, element: object) -> bytes:
    if not isinstance(element, str):
        raise DecodeError(f"{what}: BYTES data must be JSON strings, got {element!r}")
    return element.encode()


def flatten(data: object, what: str) -> list[object]:
    """JSON ``data``'s elements, row-major: a value, or (nested) lists of them.

    Raises:
        DecodeError: lists nested too deeply.
    """
    if not isinstance(data, list):
        return [data]
    flat: list[object] = []
    stack = [iter(data)]
    while stack:
        for element in stack[-1]:
            if isinstance(element, list):
                if len(stack) > 64:
                    raise DecodeError(f"{what}: data is nested too deeply")
                stack.append(iter(element))
                break
            flat.append(element)
        else:
            stack.pop()
    return flat


def _check_range(what: str, dtype: DType, array: np.ndarray[Any, Any]) -> None:
    target = dtypes.to_numpy(dtype)
    if array.size == 0 or target.kind not in "iu":
        return
    info = np.iinfo(cast(Any, target))
    # As Python numbers: numpy compares a bool or int64 scalar with UINT64's
    # maximum by converting that to a C long, which overflows.
    if array.size <= _SMALL:
        values = array.ravel().tolist()
        low, high = min(values), max(values)
    else:
        low, high = array.min().item(), array.max().item()
    if low < info.min or high > info.max:
        raise DecodeError(
            f"{what}: values from {low} to {high} do not fit {dtype.value} "
            f"({info.min} to {info.max})"
        )


def _count_message(what: str, got: int, shape: tuple[int, ...], count: int) -> str:
    return f"{what}: {got} values in data do not match shape {list(shape)} ({count} expected)"


def _decode_outputs(items: object) -> list[RequestedOutput] | None:
    if items is None:
        return None
    if not isinstance(items, list):
        raise DecodeError('"outputs" must be a list of {"name": ...} objects')
    outputs = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise DecodeError("every requested output must be a JSON object with a name")
        what = f"output {item['name']}"
        params = _parameters(item.get("parameters"), what)
        binary = params.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise DecodeError(f"{what}: binary_data must be a boolean, got {binary!r}")
        check_classification(params, what)
        outputs.append(RequestedOutput(item["name"], binary, shm_ref(params, what)))
    check_unique([output.name for output in outputs], "output")
    return outputs


def check_classification(params: dict[str, Any], what: str) -> None:
    """Refuse Triton's classification extension, which is not implemented."""
    if params.get("classification"):
        raise DecodeError(
            f"{what}: the classification extension is not supported; request the output "
            "without a class count"
        )


# -- responses -----------------------------------------------------------------


def encode_infer_response(
    model: str, version: str, request_id: str, outputs: Sequence[OutputData]
) -> tuple[bytes, int | None]:
    """Encode a response: its body and, when blobs follow, the JSON length.

    Raises:
        DecodeError: a BYTES output that must travel as JSON is not UTF-8.
    """
    doc: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id:
        doc["id"] = request_id
    said = response_parameters(outputs)
    if said:
        doc["parameters"] = dict(said)  # the model's of the whole response (MLServer's)
    entries: list[dict[str, Any]] = []
    blobs: list[memoryview] = []
    for output in outputs:
        tensor = output.tensor
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": tensor.dtype.value,
            "shape": list(tensor.shape),
        }
        if output.parameters:
            entry["parameters"] = dict(output.parameters)  # the model's (MLServer's content_type)
        if output.shm is not None:
            pass  # SPEC: §2.4 — the data is in the client's region, not the body.
        elif output.binary:
            raw = tensor.raw()
            if output.parameters:
                entry["parameters"]["binary_data_size"] = raw.nbytes
            else:
                entry["parameters"] = {"binary_data_size": raw.nbytes}
            blobs.append(raw)
        else:
            entry["data"] = json_data(output.name, tensor)
        entries.append(entry)
    doc["outputs"] = entries
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return join(header, blobs), len(header)


def json_data(name: str, tensor: Tensor) -> Any:
    """Return a tensor's elements as a flat JSON-ready value."""
    array = tensor.array().reshape(-1)
    if tensor.dtype is not DType.BYTES:
        return np.ascontiguousarray(array)
    try:
        return [bytes(cast(Any, element)).decode() for element in array]
    except UnicodeDecodeError:
        raise DecodeError(
            f"output {name} holds bytes that are not UTF-8, so they cannot travel as JSON "
            "strings; request it with binary_data"
        ) from None


def join(header: bytes, blobs: Sequence[memoryview]) -> bytes:
    """Concatenate the header and blobs, copying each once."""
    return b"".join([header, *blobs])


def encode_error(message: str) -> bytes:
    """Return the REST error body."""
    return orjson.dumps({"error": message})
