"""KServe v2 protobuf messages <-> :class:`InferRequest` and outputs.

Pure: generated message classes and serialized messages in and out. SPEC:
PROTOCOL-FACTS §2.2 — inputs come as ``raw_input_contents`` (one entry per
input not in shared memory, in order) or as typed ``contents``, never both;
outputs always go back in ``raw_output_contents``, one entry per output in
the order of ``outputs`` (tritonclient reads nothing else), an empty entry
for an output written into shared memory.

Importing this module defines ``inference.*`` in the default protobuf pool:
never import it into a process that imports tritonclient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from appliance._generated import kserve_pb2
from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.protocols.kserve.codec import check_classification
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

# The generated messages (typed Any: mypy skips generated code).
pb: Any = kserve_pb2

# Which InferTensorContents field holds each datatype. FP16 has none: it
# must travel raw.
_CONTENTS_FIELD: dict[DType, str] = {
    DType.BOOL: "bool_contents",
    DType.INT8: "int_contents",
    DType.INT16: "int_contents",
    DType.INT32: "int_contents",
    DType.INT64: "int64_contents",
    DType.UINT8: "uint_contents",
    DType.UINT16: "uint_contents",
    DType.UINT32: "uint_contents",
    DType.UINT64: "uint64_contents",
    DType.FP32: "fp32_contents",
    DType.FP64: "fp64_contents",
    DType.BYTES: "bytes_contents",
}

# The numpy type of each InferTensorContents field's proto type.
_FIELD_NUMPY: dict[str, type[np.generic]] = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


def decode_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a map of InferParameter into plain Python values (all five kinds)."""
    values: dict[str, Any] = {}
    # PERF: an empty map (most requests, most tensors) skips .items(), which
    # protobuf's maps inherit from collections.abc as Python: 16 bytecodes a call.
    if not parameters:
        return values
    for key, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        values[key] = None if kind is None else getattr(parameter, kind)
    return values


def encode_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a protobuf map of InferParameter from plain Python values."""
    for key, value in values.items():
        parameter = target[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            if value < 0 or value < 1 << 63:
                parameter.int64_param = value
            else:
                parameter.uint64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = str(value)


def decode_infer_request(request: Any) -> InferRequest:
    """Decode a ModelInferRequest.

    Raises:
        DecodeError: bad datatypes, shapes, byte sizes, or a mix of raw and
            typed contents.
    """
    raw = request.raw_input_contents
    inputs = []
    per_input = []
    index = 0
    for tensor in request.inputs:
        parameters = decode_parameters(tensor.parameters)
        decoded, used = _decode_input(tensor, parameters, raw, index)
        inputs.append(decoded)
        per_input.append((decoded.name, parameters))
        index += used
    if raw and index != len(raw):
        raise DecodeError(
            f"the request has {len(raw)} raw_input_contents for {index} inputs not in "
            "shared memory; give exactly one per input, in order"
        )
    check_unique([tensor.name for tensor in inputs], "input")
    outputs = None
    if request.outputs:
        outputs = [_decode_output(output) for output in request.outputs]
        check_unique([output.name for output in outputs], "output")
    return InferRequest(
        request.model_name,
        request.model_version,
        request.id,
        with_input_parameters(decode_parameters(request.parameters), per_input),
        inputs,
        outputs,
    )


def _decode_input(
    tensor: Any, parameters: dict[str, Any], raw: Sequence[bytes], index: int
) -> tuple[InputTensor, int]:
    name = tensor.name
    what = f"input {name}"
    dtype = parse_dtype(tensor.datatype, what)
    shape = parse_shape(list(tensor.shape), what)
    shm = shm_ref(parameters, what)
    has_contents = tensor.HasField("contents")
    if shm is not None:
        if has_contents:
            raise DecodeError(f"{what} is in shared memory and must not also carry contents")
        return InputTensor(name, dtype, shape, shm=shm), 0
    if raw:
        if has_contents:
            raise DecodeError(
                f"{what} has typed contents but the request uses raw_input_contents; "
                "use one form for every input"
            )
        if index >= len(raw):
            raise DecodeError(f"{what} has no raw_input_contents entry (only {len(raw)} given)")
        return InputTensor(
            name, dtype, shape, tensor_from_buffer(name, dtype, shape, raw[index])
        ), 1
    if not has_contents and dtypes.element_count(shape):
        raise DecodeError(f"{what} has no data: no raw_input_contents, contents or shared memory")
    return InputTensor(name, dtype, shape, _from_contents(name, dtype, shape, tensor.contents)), 0


def _from_contents(name: str, dtype: DType, shape: tuple[int, ...], contents: Any) -> Tensor:
    what = f"input {name}"
    field = _CONTENTS_FIELD.get(dtype)
    if field is None:
        raise DecodeError(f"{what}: {dtype.value} data must be sent in raw_input_contents")
    values = getattr(contents, field)
    count = dtypes.element_count(shape)
    if len(values) != count:
        raise DecodeError(
            f"{what}: {len(values)} values in {field} do not match shape {list(shape)} "
            f"({count} expected)"
        )
    if dtype is DType.BYTES:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return Tensor(dtype, shape, array.reshape(shape))
    target = dtypes.to_numpy(dtype)
    # The field's own type: numpy would guess float64 for a mix of small and
    # >= 2**63 uint64 values, and corrupt them.
    wide = np.fromiter(values, dtype=_FIELD_NUMPY[field], count=len(values))
    if target.kind in "iu" and wide.size:
        info = np.iinfo(cast(Any, target))
        if wide.min() < info.min or wide.max() > info.max:
            raise DecodeError(f"{what}: values in {field} do not fit {dtype.value}")
    return Tensor(dtype, shape, wide.astype(target).reshape(shape))


def _decode_output(output: Any) -> RequestedOutput:
    what = f"output {output.name}"
    params = decode_parameters(output.parameters)
    check_classification(params, what)
    return RequestedOutput(output.name, None, shm_ref(params, what))


# Length-delimited wire tags (field number << 3 | 2).
_RAW_OUTPUT_TAG = b"\x32"  # ModelInferResponse.raw_output_contents = 6
_INFER_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response = 2


def encode_infer_response(
    model: str,
    version: str,
    request_id: str,
    outputs: Sequence[OutputData],
    parameters: Mapping[str, Any] | None = None,
) -> bytes:
    """Serialize a ModelInferResponse; every output's data in raw_output_contents.

    PERF: protobuf would copy each output three times (into bytes, into the
    message, out again when serializing). A message is just its fields one
    after another, so protobuf serializes the small header fields and each
    raw_output_contents field is appended by hand, copied once from the
    model worker's ring.
    """
    header = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    for output in outputs:
        tensor = output.tensor
        added = header.outputs.add(
            name=output.name, datatype=tensor.dtype.value, shape=list(tensor.shape)
        )
        if output.parameters:
            encode_parameters(added.parameters, _scalars(output.parameters))
    said = response_parameters(outputs)
    if said:
        encode_parameters(header.parameters, _scalars(said))  # the model's (MLServer's)
    if parameters:
        encode_parameters(header.parameters, parameters)
    parts: list[bytes | memoryview] = [header.SerializeToString()]
    for output in outputs:
        raw = memoryview(b"") if output.shm is not None else output.tensor.raw()
        parts += [_RAW_OUTPUT_TAG, _varint(raw.nbytes), raw]
    return b"".join(parts)


def encode_model_metadata(metadata: Mapping[str, Any]) -> Any:
    """A ModelMetadataResponse of service.model_metadata's dict: its parameters (the
    model's and each tensor's) as InferParameter maps, as MLServer's server sends them."""
    response = pb.ModelMetadataResponse(
        name=metadata["name"],
        versions=metadata["versions"],
        platform=metadata["platform"],
    )
    for field in ("inputs", "outputs"):
        for tensor in metadata[field]:
            added = getattr(response, field).add(
                name=str(tensor.get("name", "")),
                datatype=str(tensor.get("datatype", "")),
                shape=[int(dim) for dim in tensor.get("shape", ())],
            )
            if isinstance(tensor.get("parameters"), Mapping):
                encode_parameters(added.parameters, _scalars(tensor["parameters"]))
    if isinstance(metadata.get("parameters"), Mapping):
        encode_parameters(response.parameters, _scalars(metadata["parameters"]))
    return response


def _scalars(values: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters an InferParameter can hold: lists and objects have no place there
    (MLServer's gRPC server leaves them out too)."""
    return {key: value for key, value in values.items() if not isinstance(value, list | dict)}


def encode_stream_response(infer_response: bytes) -> bytes:
    """Wrap a serialized ModelInferResponse into a ModelStreamInferResponse."""
    return b"".join([_INFER_RESPONSE_TAG, _varint(len(infer_response)), infer_response])


def encode_stream_error(model: str, request_id: str, message: str) -> bytes:
    """Serialize a ModelStreamInferResponse that reports an error."""
    response = pb.ModelInferResponse(model_name=model, id=request_id)
    return bytes(
        pb.ModelStreamInferResponse(
            error_message=message, infer_response=response
        ).SerializeToString()
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
