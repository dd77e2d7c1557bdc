"""``/generate`` and ``/generate_stream``: two servers' meanings of one route.

MLServer serves them as aliases of ``infer`` and ``infer_stream``: the body
is a KServe inference request. Triton's generate extension takes a flat
JSON object instead, whose keys are the model's inputs (``text_input``,
``max_tokens``, ...) and whose ``parameters`` are the request's, and
answers a flat object of the outputs (``text_output``). The body tells them
apart: an inference request is binary (Inference-Header-Content-Length) or
has ``inputs``, a list of tensor objects.

Pure: the body and metadata in, an :class:`InferRequest` out; outputs in,
bytes out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from appliance.protocols.kserve import codec
from appliance.protocols.kserve.errors import DecodeError
from appliance.protocols.kserve.inference import InferRequest, InputTensor, OutputData, parse_dtype


def triton_form(body: bytes | memoryview, header_length: int | None) -> dict[str, Any] | None:
    """The body's JSON object when it is Triton's generate form; None for a KServe
    inference request (MLServer's generate), and for a body that is neither, which is
    then decoded as a KServe request, whose errors say what it lacks."""
    if header_length is not None:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    inputs = doc.get("inputs")
    if isinstance(inputs, list) and all(isinstance(item, dict) for item in inputs):
        return None
    return doc


# -- Triton's form -------------------------------------------------------------------


def decode_request(
    doc: Mapping[str, Any], metadata: Mapping[str, Any], model: str, version: str = ""
) -> InferRequest:
    """Triton's generate request: each key (``parameters``' own included) that names one
    of the model's inputs is that input, one value or a list; any other key is
    a request parameter (a string, number or boolean). ``id`` is the request's id, and a
    parameter as well, as in Triton.

    ``doc``: the body's JSON object (:func:`triton_form`).

    Raises:
        DecodeError: a value of the wrong kind, an input given twice, or a count of
            values its shape cannot hold.
    """
    inputs = {item["name"]: item for item in metadata.get("inputs", [])}
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise DecodeError(f"request id must be a string, got {request_id!r}")
    nested = doc.get("parameters", {})
    if not isinstance(nested, dict):
        raise DecodeError('"parameters" must be a JSON object')
    if "parameters" in inputs:
        raise DecodeError(
            f'model {model} has an input named "parameters", which a generate request '
            "cannot give: use infer"
        )
    tensors: dict[str, InputTensor] = {}
    parameters: dict[str, Any] = {}
    for key, value in [*((k, v) for k, v in doc.items() if k != "parameters"), *nested.items()]:
        spec = inputs.get(key)
        if spec is None:
            parameters[key] = _parameter(key, value)
        elif key in tensors:
            raise DecodeError(f"input {key} is given twice")
        else:
            tensors[key] = _input(key, spec, value)
    return InferRequest(model, version, request_id, parameters, list(tensors.values()), None)


def _parameter(key: str, value: object) -> str | int | float | bool:
    if isinstance(value, str | int | float | bool):
        return value
    raise DecodeError(
        f"{key} is neither an input of the model nor a parameter: a parameter is a string, "
        f"a number or a boolean, got {type(value).__name__}"
    )


def _input(name: str, spec: Mapping[str, Any], value: object) -> InputTensor:
    """One input from its JSON value, shaped as its metadata allows."""
    what = f"input {name}"
    dtype = parse_dtype(spec.get("datatype"), what)
    values = codec.flatten(value, what)
    if any(isinstance(item, dict) or item is None for item in values):
        raise DecodeError(f"{what}: a value is a string, a number or a boolean")
    shape = fit_shape(name, [int(d) for d in spec.get("shape", [])], len(values))
    # Each value's kind is checked against the datatype there, as for infer's JSON.
    return InputTensor(name, dtype, shape, codec.tensor_from_json(name, dtype, shape, values))


def fit_shape(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """The shape of ``count`` values in dims where -1 is free, as Triton fits them: the
    fixed dims first, the innermost free dim takes what is left, other free dims are 1."""
    left = count
    for dim in dims:
        if dim >= 0:
            if dim == 0 or left % dim:
                left = -1
                break
            left //= dim
    free = [index for index, dim in enumerate(dims) if dim < 0]
    if left < 0 or (not free and left != 1):
        raise DecodeError(
            f"input {name}: {count} value(s) do not fit its shape {dims} (-1 is any size)"
        )
    shape = [1 if dim < 0 else dim for dim in dims]
    if free:
        shape[free[-1]] = left
    return tuple(shape)


def encode_response(
    model: str, version: str, request_id: str, outputs: Sequence[OutputData]
) -> bytes:
    """Triton's generate response: ``model_name``, ``model_version``, ``id`` when the
    request had one, and each output under its name, a single value where it holds one
    and a flat list otherwise (BYTES as strings). Keys sorted, as Triton writes them;
    an output named like one of the response's own keys is left out, as in Triton."""
    doc: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id:
        doc["id"] = request_id
    for output in outputs:
        if output.name in doc:
            continue
        data = codec.json_data(output.name, output.tensor)
        if len(data) == 1:
            data = data[0]
        doc[output.name] = data
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)
