"""Triton's model_configuration extension: a served model's configuration as a ModelConfig.

The dict returned is the REST body; ``grpc`` parses it into the protobuf
ModelConfig. Apart from ``service`` because rendering the appliance's
settings in Triton's terms (backends, instance groups, warmup, batching) is
a job of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from appliance.client.api import ModelClient
from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.tensor import TensorSpec
from appliance.protocols.kserve.ensemble import ensemble_config
from appliance.protocols.kserve.service import resolve

if TYPE_CHECKING:
    # Only its shape: the client hands the protocols the settings it serves with.
    from appliance.config.settings import ModelConfig


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
