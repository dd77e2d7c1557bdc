"""Running a KServe inference request, whichever transport carried it.

``rest`` and ``grpc`` decode a request into an :class:`InferRequest`
(inference.py, the request's shape) and run it here: its inputs taken from
the request or from registered shared-memory regions (shm.py), the model
client called, and its outputs written into regions or handed back for the
transport to encode. Apart from ``service``, which answers about the server
and its models, because this is the per-request path; a streaming
(decoupled) model's parts are in ``infer_stream``.

Compiled with the request path (appliance/native.py): ``infer_stream``
holds the async generator, which mypyc does not compile.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.client.api import ModelClient
from appliance.client.result import InferResult
from appliance.core import dtypes
from appliance.core.client_memory import ClientSpan, ClientTensor
from appliance.core.device_tensors import CudaPlace, DeviceTensor
from appliance.core.dtypes import DType
from appliance.core.output_parameters import from_body, response_from_body
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest
from appliance.protocols.kserve.inference import (
    InferRequest,
    OutputData,
    RequestedOutput,
    check_byte_size,
    tensor_from_buffer,
)
from appliance.protocols.kserve.response_outputs import ResponseOutputs
from appliance.protocols.kserve.service import resolve
from appliance.protocols.kserve.shm import RegionTable
from appliance.protocols.kserve.shm_places import Target


async def infer_async(
    client: ModelClient, regions: RegionTable, request: InferRequest, timeout_s: float | None
) -> Answer:
    """Run a request; its answer, whose outputs are valid in its ``with`` block.

    Inputs in system shared memory are read from the client's segment
    straight into the model client's ring, by a copy that a client
    shrinking its file cannot kill (core/client_memory.py); outputs asked
    for in shared memory are written into the client's segment the same
    way and carry no data back. Tensors in CUDA regions are the model worker's
    to read and write (their places travel in the descriptor). The call
    waits in the event loop, without a thread.
    """
    call = prepare(client, regions, request)
    result = await client.infer_async(
        call.model,
        call.inputs,
        call.names,
        call.parameters,
        timeout_s,
        call.on_device,
        request_id=request.id,
    )
    return Answer(request, result, call.targets)


class Answer:
    """A request's outputs (``with answer as outputs``), given back when the block ends.

    PERF: a plain context around an awaited call, where an async context
    manager ran an async generator and two more awaits on every request.
    """

    __slots__ = ("_request", "_result", "_targets")

    def __init__(
        self, request: InferRequest, result: InferResult, targets: dict[str, Target | CudaPlace]
    ) -> None:
        self._request, self._result, self._targets = request, result, targets

    def __enter__(self) -> list[OutputData]:
        result = self._result
        try:
            return outputs_of(self._request, result.outputs, self._targets, result.body)
        except BaseException:
            result.release()
            raise

    def __exit__(self, *_exc: object) -> None:
        self._result.release()


class Call:
    """A request made ready for the model client."""

    __slots__ = ("inputs", "model", "names", "parameters", "targets")

    def __init__(
        self,
        model: str,
        inputs: dict[str, Tensor | DeviceTensor | ClientTensor],
        targets: dict[str, Target | CudaPlace],
        names: list[str] | None,
        parameters: dict[str, Any],
    ) -> None:
        self.model = model
        self.inputs = inputs
        self.targets = targets
        self.names = names
        self.parameters = parameters

    @property
    def on_device(self) -> dict[str, CudaPlace] | None:
        """The outputs the model worker writes into a client's CUDA region."""
        places = {n: t for n, t in self.targets.items() if isinstance(t, CudaPlace)}
        return places or None


def prepare(client: ModelClient, regions: RegionTable, request: InferRequest) -> Call:
    """The request's model, inputs, output places, wanted outputs and parameters."""
    model = request.model
    if request.version:
        model, _ = resolve(client, model, request.version)
    return Call(
        model,
        _inputs(regions, request),
        _output_targets(regions, request),
        None if request.outputs is None else [o.name for o in request.outputs],
        request.model_parameters(),
    )


def _inputs(
    regions: RegionTable, request: InferRequest
) -> dict[str, Tensor | DeviceTensor | ClientTensor]:
    tensors: dict[str, Tensor | DeviceTensor | ClientTensor] = {}
    for item in request.inputs:
        if item.data is not None:
            tensors[item.name] = item.data
            continue
        assert item.shm is not None
        where = regions.read(item.shm, f"input {item.name}")
        if isinstance(where, CudaPlace):
            tensors[item.name] = _device_input(item.name, item.dtype, item.shape, where)
        elif item.dtype is DType.BYTES:
            # The elements' lengths are read to find the tensor's end: from a
            # private copy, which the client can no longer change under us.
            view = where if isinstance(where, memoryview) else memoryview(where.read())
            view = view[: _packed_length(item.name, view, dtypes.element_count(item.shape))]
            tensors[item.name] = tensor_from_buffer(item.name, item.dtype, item.shape, view)
        elif isinstance(where, ClientSpan):
            check_byte_size(item.name, item.dtype, item.shape, where.nbytes)
            tensors[item.name] = ClientTensor(item.dtype, item.shape, where)
        else:
            tensors[item.name] = tensor_from_buffer(item.name, item.dtype, item.shape, where)
    return tensors


def _device_input(
    name: str, dtype: DType, shape: tuple[int, ...], place: CudaPlace
) -> DeviceTensor:
    """An input the model worker reads from a client's CUDA region.

    Raises:
        BadRequest: BYTES, or its byte size does not match its shape.
    """
    if dtype is DType.BYTES:
        raise BadRequest(
            f"input {name}: BYTES tensors cannot be read from CUDA shared memory; "
            "use system shared memory or send them in the request"
        )
    expected = dtypes.element_count(shape) * dtypes.item_size(dtype)
    if place.nbytes != expected:
        raise BadRequest(
            f"input {name}: shared_memory_byte_size {place.nbytes} does not match shape "
            f"{list(shape)} of {dtype.value} ({expected} bytes expected)"
        )
    return DeviceTensor(dtype, shape, place)


def _packed_length(name: str, view: memoryview, count: int) -> int:
    """Return how many bytes ``count`` packed BYTES elements take in ``view``."""
    at = 0
    for index in range(count):
        if at + 4 > len(view):
            raise BadRequest(
                f"input {name}: its shared memory holds {index} of {count} BYTES elements"
            )
        at += 4 + int.from_bytes(view[at : at + 4], "little")
    if at > len(view):
        raise BadRequest(f"input {name}: its last BYTES element runs past its shared memory")
    return at


def _output_targets(regions: RegionTable, request: InferRequest) -> dict[str, Target | CudaPlace]:
    return {
        output.name: regions.target(output.shm, f"output {output.name}")
        for output in request.outputs or ()
        if output.shm is not None
    }


def outputs_of(
    request: InferRequest,
    produced: dict[str, Tensor],
    targets: dict[str, Target | CudaPlace],
    body: Mapping[str, Any] | None,
) -> ResponseOutputs:
    """The outputs to encode, as the request asked for them, with the parameters the
    model gave each and the response (in the reply's ``body``)."""
    parameters = from_body(body)
    wanted = request.outputs
    if wanted is None:
        wanted = [RequestedOutput(name) for name in produced]
    outputs = []
    for output in wanted:
        tensor = produced.get(output.name)
        if tensor is None:
            raise BadRequest(f"model {request.model} did not produce output {output.name!r}")
        if output.shm is not None:
            target = targets[output.name]
            if isinstance(target, Target):  # else the model worker has written it
                _write(output, tensor, target)
        binary = request.binary_output if output.binary is None else output.binary
        given = parameters.get(output.name) if parameters else None
        outputs.append(OutputData(output.name, tensor, binary, output.shm, given))
    return ResponseOutputs(outputs, response_from_body(body))


def _write(output: RequestedOutput, tensor: Tensor, target: Target) -> None:
    raw = tensor.raw()
    if raw.nbytes > target.nbytes:
        assert output.shm is not None
        raise BadRequest(
            f"output {output.name} needs {raw.nbytes} bytes but its shared_memory_byte_size "
            f"is {output.shm.byte_size} (region {output.shm.region!r})"
        )
    target.write(raw)
