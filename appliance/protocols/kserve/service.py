"""What the KServe endpoints do, whichever transport asked.

``rest`` and ``grpc`` decode their wire form, call these functions and
encode what they return. The dicts returned here are the REST bodies as the
Triton docs show them; ``grpc`` parses them into the protobuf messages, so
both transports answer the same thing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import appliance
from appliance.client.api import ModelClient
from appliance.client.inflight import InferResult
from appliance.config.settings import ModelConfig
from appliance.core import cuda, dtypes
from appliance.core.client_memory import ClientSpan, ClientTensor
from appliance.core.device_tensors import CudaPlace, DeviceTensor
from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.output_parameters import from_body, response_from_body
from appliance.core.status import Counter
from appliance.core.tensor import Tensor, TensorSpec
from appliance.errors import ApplianceError, BadRequest, ModelNotFound, Unsupported
from appliance.observability import tracing
from appliance.observability.metrics import cache_totals
from appliance.protocols.kserve.ensemble import ensemble_config
from appliance.protocols.kserve.inference import (
    InferRequest,
    OutputData,
    RequestedOutput,
    ResponseOutputs,
    check_byte_size,
    tensor_from_buffer,
)
from appliance.protocols.kserve.shm import RegionTable, Target

# SPEC: PROTOCOL-FACTS §2.7 — Triton's simple_*_health_metadata examples
# require the server name "triton"; the version says what is really serving.
SERVER_NAME = "triton"
SERVER_VERSION = f"appliance-{appliance.__version__}"
# Exactly the extensions implemented here (PROTOCOL-FACTS §2.3-2.6).
EXTENSIONS = (
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_configuration",
    "system_shared_memory",
    "model_repository",
    "trace",
)
# Advertised only where a CUDA driver is installed (shm.py, cuda.py).
CUDA_EXTENSION = "cuda_shared_memory"
_STAT_KEYS = ("compute_input", "compute_output", "cache_hit", "cache_miss")


def server_metadata() -> dict[str, Any]:
    extensions = [*EXTENSIONS, CUDA_EXTENSION] if cuda.installed() else list(EXTENSIONS)
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": extensions}


def trace_settings(
    client: ModelClient, model: str | None, changes: dict[str, Any] | None
) -> dict[str, Any]:
    """Read (``changes`` None) or change the trace settings, global or of ``model``.

    A None value in ``changes`` clears the model's own setting (it follows
    the global one again).

    Raises:
        ModelNotFound: no such model.
        BadRequest: an unknown setting or a bad value.
        Unsupported: this process keeps no trace settings.
    """
    settings = tracing.settings()
    if settings is None:
        raise Unsupported("this server process keeps no trace settings")
    if model and model not in client.models():
        raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
    if changes:
        return settings.update(model or None, changes)
    return settings.get(model or None)


def served_name(client: ModelClient, model: str, version: str) -> str:
    """Return the served model that answers for ``version`` of ``model``.

    A model repository serves a model's newest version under its name and
    older ones as ``<name>.v<N>`` (repository.py); Triton clients ask for
    those as ``/v2/models/<name>/versions/<N>``.
    """
    if version:
        older = f"{model}.v{version}"
        if older in client.models():
            return older
    return model


def all_versions(client: ModelClient, model: str, newest: Sequence[str]) -> list[str]:
    """The versions served for ``model``: its own and its ``.v<N>`` siblings'."""
    prefix = f"{model}.v"
    older = [name[len(prefix) :] for name in client.models() if name.startswith(prefix)]
    return sorted({*older, *newest}, key=lambda v: (len(v), v))


def resolve(client: ModelClient, model: str, version: str) -> tuple[str, ModelMetadata]:
    """Return the served model answering for ``version`` of ``model``, and its metadata.

    Raises:
        BadRequest: ``version`` is not a number.
        ModelNotFound: no such model, or no such version of it.
        ModelNotReady: the model has not loaded yet.
    """
    served = served_name(client, model, version)
    if version and not version.isdecimal() and not _serves_version(client, served, version):
        # Triton's own wording: its example clients look for it. (A version of
        # an MLServer folder's model may be text, "v0.1.0": that one is served.)
        raise BadRequest(f"failed to get model version from specified version string '{version}'")
    metadata = client.metadata(served)
    if version and version not in metadata.versions:
        versions = all_versions(client, model, metadata.versions)
        raise ModelNotFound(
            f"Request for unknown model: '{model}' version {version} is not found; "
            f"it has version(s) {', '.join(versions) or 'none'}"
        )
    return served, metadata


def _serves_version(client: ModelClient, served: str, version: str) -> bool:
    try:
        return version in client.metadata(served).versions
    except ApplianceError:
        return False


def version_of(client: ModelClient, model: str) -> str:
    """Return the version a model serves, "" while it is not loaded."""
    try:
        versions = client.metadata(model).versions
    except ApplianceError:
        return ""
    return versions[-1] if versions else ""


def model_ready(client: ModelClient, model: str, version: str) -> bool:
    """Online, the model has a ready instance, and serves that version."""
    if model not in client.models() or not client.status.online:
        return False
    try:
        served, _ = resolve(client, model, version)
    except ApplianceError:
        return False
    return client.model_ready(served)


def model_metadata(client: ModelClient, model: str, version: str) -> dict[str, Any]:
    """The model's KServe metadata: its declared tensors, or for a model that takes
    any tensors, those it lists (Model.listed_metadata: MLServer's settings' tensors,
    with their parameters) and its model-level parameters."""
    _, metadata = resolve(client, model, version)
    versions = [version] if version else all_versions(client, model, metadata.versions)
    listed = metadata.listed
    found: dict[str, Any] = {
        "name": model,
        "versions": versions,
        "platform": metadata.platform,
        "inputs": _tensor_metadata(metadata.inputs, listed.get("inputs")),
        "outputs": _tensor_metadata(metadata.outputs, listed.get("outputs")),
    }
    if isinstance(listed.get("parameters"), dict):
        found["parameters"] = listed["parameters"]
    return found


def _tensor_metadata(declared: Sequence[TensorSpec] | None, listed: Any) -> list[dict[str, Any]]:
    if declared is None and isinstance(listed, list):
        return [dict(item) for item in listed if isinstance(item, dict)]
    return [spec.to_dict() for spec in declared or ()]


def model_config(client: ModelClient, model: str, version: str) -> dict[str, Any]:
    """Return the model's configuration in the shape of Triton's ModelConfig."""
    _, metadata = resolve(client, model, version)
    ensemble = client.ensemble(model)
    if ensemble is not None:
        return ensemble_config(ensemble)
    configured = client.config.model(model)
    batched = metadata.max_batch_size > 0
    config: dict[str, Any] = {
        "name": model,
        "platform": metadata.platform,
        "backend": _BACKENDS.get(metadata.platform, "python"),
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": metadata.max_batch_size,
        "input": [
            {**_tensor_config(spec, batched), "optional": spec.optional}
            for spec in metadata.inputs or ()
        ],
        "output": [_tensor_config(spec, batched) for spec in metadata.outputs or ()],
        "instance_group": [_instance_group(model, configured)],
        "model_transaction_policy": {"decoupled": metadata.supports.get("predict_stream", False)},
    }
    if configured is not None and configured.options.get("response_cache"):
        config["response_cache"] = {"enable": True}
    if configured is not None and configured.options.get("warmup"):
        config["model_warmup"] = [_warmup_config(t) for t in configured.options["warmup"]]
    if metadata.sequence is not None:
        # SPEC: Triton's scheduling_choice is one of dynamic or sequence batching.
        config["sequence_batching"] = metadata.sequence
    elif batched:
        delay_ms = configured.max_queue_delay_ms if configured else 0.0
        config["dynamic_batching"] = {"max_queue_delay_microseconds": int(delay_ms * 1000)}
    return config


# Triton's backend of each platform (a model class of the appliance's answers as Python).
_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch"}


def _instance_group(model: str, configured: ModelConfig | None) -> dict[str, Any]:
    group: dict[str, Any] = {"name": model, "kind": "KIND_CPU"}
    group["count"] = configured.instances if configured else 1
    device = configured.device if configured else "cpu"
    if device.startswith("cuda"):
        group["kind"] = "KIND_GPU"
        if ":" in device:
            group["gpus"] = [int(device.partition(":")[2])]
    return group


def _warmup_config(table: dict[str, Any]) -> dict[str, Any]:
    """A warmup table (appliance/config/warmup.py) as Triton's ModelWarmup JSON."""
    inputs = {}
    for item in table.get("inputs", ()):
        data = item.get("data")
        source: dict[str, Any] = {"zero": {"zero_data": True}, "random": {"random_data": True}}.get(
            data, {"input_data_file": data}
        )
        dtype = dtypes.parse_dtype(item.get("dtype"), loose=True)
        kind = "STRING" if dtype is DType.BYTES else dtype.value
        inputs[item["name"]] = {"data_type": f"TYPE_{kind}", "dims": item.get("dims", []), **source}
    return {
        "name": table.get("name", ""),
        "batch_size": table.get("batch_size", 1),
        "inputs": inputs,
        "count": table.get("count", 0),
    }


def _tensor_config(spec: TensorSpec, batched: bool) -> dict[str, Any]:
    # SPEC: Triton's config dims leave out the batch dimension.
    dims = list(spec.shape[1:] if batched else spec.shape)
    kind = "STRING" if spec.dtype is DType.BYTES else spec.dtype.value
    return {"name": spec.name, "data_type": f"TYPE_{kind}", "dims": dims}


def model_statistics(client: ModelClient, model: str, version: str) -> list[dict[str, Any]]:
    """Return one statistics entry per model asked for (every model when "")."""
    if model:
        if model not in client.models():
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        names = [resolve(client, model, version)[0] if version else model]
    else:
        names = client.models()
    return [_statistics(client, name) for name in names]


def _statistics(client: ModelClient, model: str) -> dict[str, Any]:
    counts = client.counters(model)
    success, queue_ns, compute_ns = (
        counts[Counter.SUCCESS],
        counts[Counter.QUEUE_NS],
        counts[Counter.COMPUTE_NS],
    )
    stats = {
        "success": {"count": success, "ns": queue_ns + compute_ns},
        "fail": {"count": counts[Counter.FAIL], "ns": 0},
        "queue": {"count": success, "ns": queue_ns},
        "compute_infer": {"count": success, "ns": compute_ns},
    }
    for key in _STAT_KEYS:
        stats[key] = {"count": success if key.startswith("compute") else 0, "ns": 0}
    if client.caches(model):
        # A hit is a success that never reached the model (Triton counts it so).
        cached = cache_totals(model)
        for result in ("hit", "miss"):
            count, seconds = cached[result]
            stats[f"cache_{result}"] = {"count": count, "ns": int(seconds * 1e9)}
        hits, hit_ns = stats["cache_hit"]["count"], stats["cache_hit"]["ns"]
        for key in ("success", "queue"):
            stats[key] = {"count": stats[key]["count"] + hits, "ns": stats[key]["ns"]}
        stats["success"]["ns"] += hit_ns
    return {
        "name": model,
        "version": version_of(client, model),
        "last_inference": counts[Counter.LAST_INFERENCE_MS],
        "inference_count": counts[Counter.BATCH_ROWS],
        "execution_count": counts[Counter.BATCHES],
        "inference_stats": stats,
        "batch_stats": [],
    }


# -- inference -------------------------------------------------------------------


async def infer_async(
    client: ModelClient, regions: RegionTable, request: InferRequest, timeout_s: float | None
) -> Answer:
    """Run a request; its answer, whose outputs are valid in its ``with`` block.

    Inputs in system shared memory are read from the client's segment
    straight into the model client's ring, never through a mapping the
    client could shrink under us (core/client_memory.py); outputs asked for
    in shared memory are written into the client's segment the same way
    and carry no data back. Tensors in CUDA regions are the model worker's
    to read and write (their places travel in the descriptor). The call
    waits in the event loop, without a thread.
    """
    call = _prepare(client, regions, request)
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
            return _outputs(self._request, result.outputs, self._targets, result.body)
        except BaseException:
            result.release()
            raise

    def __exit__(self, *_exc: object) -> None:
        self._result.release()


@dataclass(slots=True)
class _Call:
    """A request made ready for the model client."""

    model: str
    inputs: dict[str, Tensor | DeviceTensor | ClientTensor]
    targets: dict[str, Target | CudaPlace]
    names: list[str] | None
    parameters: dict[str, Any]

    @property
    def on_device(self) -> dict[str, CudaPlace] | None:
        """The outputs the model worker writes into a client's CUDA region."""
        places = {n: t for n, t in self.targets.items() if isinstance(t, CudaPlace)}
        return places or None


def _prepare(client: ModelClient, regions: RegionTable, request: InferRequest) -> _Call:
    model = request.model
    if request.version:
        model, _ = resolve(client, model, request.version)
    return _Call(
        model,
        _inputs(regions, request),
        _output_targets(regions, request),
        None if request.outputs is None else [o.name for o in request.outputs],
        request.model_parameters(),
    )


async def stream_async(
    client: ModelClient, regions: RegionTable, request: InferRequest, timeout_s: float | None
) -> AsyncGenerator[list[OutputData], None]:
    """Yield the outputs of each part a streaming (decoupled) model sends.

    The parts are awaited in the event loop. Closing the generator early
    (``aclose``) cancels the stream in the worker.
    """
    if any(output.shm for output in request.outputs or ()):
        raise BadRequest("outputs of a streamed (decoupled) model cannot go to shared memory")
    call = _prepare(client, regions, request)
    stream = client.stream_async(
        call.model, call.inputs, call.names, call.parameters, timeout_s, request.id
    )
    async with contextlib.aclosing(stream) as parts:
        async for part in parts:
            yield _outputs(request, part.outputs, {}, part.body)


def decoupled(client: ModelClient, model: str) -> bool:
    """Return True when the model streams its answers (Triton's "decoupled")."""
    return bool(client.metadata(model).supports.get("predict_stream"))


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


def _outputs(
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
