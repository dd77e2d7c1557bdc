"""Triton's config.pbtxt, read into the settings a model directory's config.toml would hold.

A Triton model repository describes each model in ``config.pbtxt``: protobuf
text of Triton's ModelConfig (protos/triton_model_config.proto, parsed by
protobuf's own text format parser). :func:`read` maps what it means onto the
appliance's settings (appliance/formats/repository.py), field by field:

- ``platform`` / ``backend``: onnxruntime_onnx (backend onnxruntime) and
  pytorch_libtorch (backend pytorch) pick their runtime; ``default_model_filename``
  names the file in each version directory;
- ``max_batch_size``, ``input`` and ``output`` (``dims`` exclude the batch
  dimension when max_batch_size > 0, as in Triton; TYPE_STRING is BYTES); an
  input's ``optional``; a tensor's ``reshape`` (the ``reshape`` option:
  worker/reshape.py);
- ``instance_group``: the counts, summed; KIND_CPU on the CPU, KIND_GPU on
  the listed GPU (``gpus`` with one GPU) or spread over all (no ``gpus``);
- ``dynamic_batching``: ``max_queue_delay_microseconds``, and its priorities,
  queue policies and preferred batch sizes as the ``scheduling`` option
  (appliance/config/scheduling.py);
- ``sequence_batching``: read in appliance/formats/triton/sequences.py;
- ``version_policy``: latest (with num_versions), all, specific;
- ``parameters``: ``intra_op_thread_count`` (ONNX) as the runtime's threads;
- ``model_warmup``: the ``warmup`` option (appliance/config/warmup.py);
- ``response_cache``: the ``response_cache`` option (client/cache.py);
- ``platform: "ensemble"`` with ``ensemble_scheduling``: an ensemble's steps
  (model, version, input_map, output_map) and its declared tensors, read as
  appliance/config/ensembles.py reads the same in TOML; the scheduling fields of a
  model (instances, batching, parameters) do not apply to it and are noted.

A field that would change what a client sees and that the appliance cannot
honour (shape-tensor inputs, ragged batches, decoupled models other than
Python-backend ones, batch inputs and outputs, iterative sequences, several
GPUs of a group) makes the model unservable, with the field named. Every other
field that is set but not used (optimization, rate limiters, other parameters,
...) is accepted and returned as a note, which the model's worker logs once at
load. docs/reference/triton-model-config.md places every field.

Rule: imported only when a repository holds a config.pbtxt (protobuf's text
format parser is not free to import), and it imports no runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from appliance._generated import triton_model_config_pb2 as mc
from appliance.formats.triton.sequences import PbtxtError as PbtxtError
from appliance.formats.triton.sequences import SequenceFields, is_set

FILE = "config.pbtxt"
PYTHON = "python"

_PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime_onnx",
    "pytorch_libtorch": "pytorch_libtorch",
}
_BACKENDS = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch", PYTHON: PYTHON}
# ModelConfig fields read below; any other field that is set becomes a note.
_USED = {
    "name",
    "platform",
    "backend",
    "version_policy",
    "max_batch_size",
    "input",
    "output",
    "instance_group",
    "default_model_filename",
    "dynamic_batching",
    "sequence_batching",
    "parameters",
    "model_transaction_policy",
    "model_warmup",
    "response_cache",
}
# Set, these change what a client sees in ways the appliance does not serve.
_REFUSED = {
    "batch_input": "batch inputs (Triton's ragged batching) are not served",
    "batch_output": "batch outputs (Triton's ragged batching) are not served",
}
_THREADS_PARAMETER = "intra_op_thread_count"
ENSEMBLE = "ensemble"
# What an ensemble's config.pbtxt may set besides its steps; anything else
# (instance groups, batching, parameters: a worker's settings) is noted.
_ENSEMBLE_USED = {"name", "platform", "max_batch_size", "input", "output", "version_policy"}
_ENSEMBLE_USED |= {"ensemble_scheduling"}


def read(model_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """Read ``<model_dir>/config.pbtxt``; return its settings and notes on fields not used.

    Raises:
        FileNotFoundError: there is no config.pbtxt.
        PbtxtError: it does not parse, or names what the appliance cannot serve
            (the message names the field).
    """
    return _Reader(_parse(model_dir / FILE), model_dir).settings()


def _parse(path: Path) -> Any:
    """The ModelConfig a config.pbtxt holds.

    Raises:
        PbtxtError: it is not a Triton model config.
    """
    config = mc.ModelConfig()
    try:
        text_format.Parse(path.read_text(encoding="utf-8", errors="replace"), config)
    except text_format.ParseError as ex:
        raise PbtxtError(f"it is not a Triton model config: {ex}") from None
    return config


class _Reader(SequenceFields):
    def __init__(self, config: Any, model_dir: Path) -> None:
        self.config = config
        self.model_dir = model_dir
        self.notes: list[str] = []
        self.reshapes: dict[str, dict[str, list[int]]] = {}

    def settings(self) -> tuple[dict[str, Any], list[str]]:
        config = self.config
        if config.name and config.name != self.model_dir.name:
            raise PbtxtError(
                f"name: {config.name!r} is not its directory's name {self.model_dir.name!r} "
                "(Triton requires them equal)"
            )
        for field, reason in _REFUSED.items():
            if is_set(config, field):
                raise PbtxtError(f"{field}: {reason}")
        settings: dict[str, Any] = {}
        platform = self._platform()
        if platform == ENSEMBLE:
            return self._ensemble(), self.notes
        if config.HasField("ensemble_scheduling"):
            raise PbtxtError(
                'ensemble_scheduling: only an ensemble (platform: "ensemble") has steps'
            )
        if platform:
            settings["platform"] = platform
        if config.default_model_filename:
            settings["model_file"] = config.default_model_filename
        batched = config.max_batch_size > 0
        if batched or platform != PYTHON:
            # A Python model's auto_complete_config may set it when the file does not.
            settings["max_batch_size"] = max(config.max_batch_size, 0)
        if config.input:
            settings["inputs"] = [
                self._tensor("input", i, t, batched) for i, t in enumerate(config.input)
            ]
        if config.output:
            settings["outputs"] = [
                self._tensor("output", i, t, batched) for i, t in enumerate(config.output)
            ]
        settings.update({"reshape": self.reshapes} if self.reshapes else {})
        settings.update(self._instances())
        settings.update(self._scheduling(batched))
        settings.update(self._versions())
        settings.update(self._parameters())
        settings.update(self._warmups())
        settings.update({"response_cache": True} if config.response_cache.enable else {})
        self._refuse_unserved(platform)
        for field in sorted(f.name for f, _ in config.ListFields() if f.name not in _USED):
            self.notes.append(f"{field} is not used by the appliance")
        return settings, self.notes

    def _warmups(self) -> dict[str, Any]:
        samples = self.config.model_warmup
        return {"warmup": [self._warmup(i, s) for i, s in enumerate(samples)]} if samples else {}

    def _warmup(self, index: int, sample: Any) -> dict[str, Any]:
        """One model_warmup sample as a ``warmup`` table (appliance/config/warmup.py checks it)."""
        where = f"model_warmup[{index}] ({sample.name or 'no name'})"
        inputs = []
        for name, item in sorted(sample.inputs.items()):
            choice = item.WhichOneof("input_data_type")
            if choice is None:
                raise PbtxtError(
                    f"{where}.inputs[{name}]: set zero_data, random_data or input_data_file"
                )
            if item.data_type in (mc.TYPE_INVALID, mc.TYPE_BF16):
                kind = mc.DataType.Name(item.data_type)
                raise PbtxtError(f"{where}.inputs[{name}].data_type: {kind} is not served")
            dtype = mc.DataType.Name(item.data_type).removeprefix("TYPE_")
            data = {"zero_data": "zero", "random_data": "random"}.get(choice)
            inputs.append(
                {
                    "name": name,
                    "dtype": "BYTES" if dtype == "STRING" else dtype,
                    "dims": [int(d) for d in item.dims],
                    "data": data or item.input_data_file,
                }
            )
        return {
            "name": sample.name,
            "batch_size": int(sample.batch_size),
            "count": int(sample.count),
            "inputs": inputs,
        }

    def _refuse_unserved(self, platform: str) -> None:
        """What a model of this platform asks for that it cannot be served with."""
        config = self.config
        python = platform == PYTHON
        if config.response_cache.enable and config.HasField("sequence_batching"):
            raise PbtxtError(
                "response_cache: a sequence model's answers depend on its state: not cached"
            )
        if config.response_cache.enable and config.model_transaction_policy.decoupled:
            raise PbtxtError("response_cache: a decoupled model's streams are not cached")
        if config.model_warmup and config.HasField("sequence_batching"):
            raise PbtxtError("model_warmup: warming up a sequence model is not served")
        if config.model_transaction_policy.decoupled and config.sequence_batching.state:
            raise PbtxtError(
                "sequence_batching.state: a decoupled model's implicit state is not carried "
                "(keep a sequence's state in the model, by request.correlation_id())"
            )
        if config.model_transaction_policy.decoupled and not python:
            raise PbtxtError(
                "model_transaction_policy.decoupled: a decoupled (streaming) model is served "
                "from a Python-backend model.py or a model class with predict_stream, not from "
                "a model file"
            )

    def _ensemble(self) -> dict[str, Any]:
        """An ensemble's table, in the shape appliance/config/ensembles.py reads."""
        config = self.config
        if not config.ensemble_scheduling.step:
            raise PbtxtError("ensemble_scheduling.step: an ensemble needs at least one step")
        batched = config.max_batch_size > 0
        steps = []
        for index, step in enumerate(config.ensemble_scheduling.step):
            if step.model_namespace:
                self.notes.append(f"ensemble_scheduling.step[{index}].model_namespace is not used")
            steps.append(
                {
                    "model": step.model_name,
                    "version": max(int(step.model_version), -1),
                    "input_map": dict(step.input_map),
                    "output_map": dict(step.output_map),
                }
            )
        if config.ensemble_scheduling.max_inflight_requests:
            self.notes.append("ensemble_scheduling.max_inflight_requests is not used")
        if config.model_transaction_policy.decoupled:
            # Its steps would stream parts that an ensemble here passes on whole.
            raise PbtxtError(
                "model_transaction_policy.decoupled: a decoupled ensemble is not served; "
                "its steps answer one reply per request here"
            )
        used = {f.name for f, _ in config.ListFields()}
        for field in sorted(used - _ENSEMBLE_USED):
            self.notes.append(f"{field} is not used by an ensemble (its steps' models have theirs)")
        return {
            "platform": ENSEMBLE,
            "max_batch_size": max(config.max_batch_size, 0),
            "inputs": [self._tensor("input", i, t, batched) for i, t in enumerate(config.input)],
            "outputs": [self._tensor("output", i, t, batched) for i, t in enumerate(config.output)],
            "steps": steps,
        }

    def _platform(self) -> str:
        config = self.config
        if config.platform == ENSEMBLE:
            return ENSEMBLE
        if config.platform:
            found = _PLATFORMS.get(config.platform)
            if found is None:
                raise PbtxtError(
                    f"platform: {config.platform!r} has no runtime here; the appliance serves "
                    f"{' and '.join(_PLATFORMS)} model files"
                )
            return found
        if config.backend:
            found = _BACKENDS.get(config.backend)
            if found is None:
                raise PbtxtError(
                    f"backend: {config.backend!r} has no runtime here; the appliance serves "
                    f"the {', '.join(_BACKENDS)} backends"
                )
            return found
        return ""

    def _tensor(self, kind: str, index: int, tensor: Any, batched: bool) -> dict[str, Any]:
        where = f"{kind}[{index}] ({tensor.name or 'no name'})"
        if not tensor.name:
            raise PbtxtError(f"{where}: name is missing")
        for field in ("is_shape_tensor", "allow_ragged_batch"):
            if is_set(tensor, field):
                raise PbtxtError(f"{where}.{field}: not served")
        for field in ("format", "label_filename", "is_non_linear_format_io"):
            if is_set(tensor, field):
                self.notes.append(f"{where}.{field} is not used")
        if tensor.data_type in (mc.TYPE_INVALID, mc.TYPE_BF16):
            name = mc.DataType.Name(tensor.data_type)
            raise PbtxtError(f"{where}.data_type: {name} is not one of the appliance's types")
        dtype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        dims = [int(d) for d in tensor.dims]
        if any(d < -1 for d in dims):
            raise PbtxtError(f"{where}.dims: {dims} holds a size below -1")
        shape = [-1, *dims] if batched else dims
        if tensor.HasField("reshape"):
            shape = self._reshape(where, tensor, shape, batched)
        table: dict[str, Any] = {
            "name": tensor.name,
            "dtype": "BYTES" if dtype == "STRING" else dtype,
            "shape": shape,
        }
        if kind == "input" and tensor.optional:
            table["optional"] = True
        return table

    def _reshape(self, where: str, tensor: Any, client: list[int], batched: bool) -> list[int]:
        """The shape the model sees of a reshaped tensor (its table's shape, which a
        runtime checks against the model file); both shapes go to the ``reshape`` option."""
        wanted = [int(d) for d in tensor.reshape.shape]
        if any(d < -1 for d in wanted) or wanted.count(-1) > 1:
            raise PbtxtError(
                f"{where}.reshape.shape: {wanted}: sizes >= 0 and at most one -1 are served"
            )
        dims = client[1:] if batched else client
        if -1 not in wanted and -1 not in dims and _count(wanted) != _count(dims):
            raise PbtxtError(
                f"{where}.reshape.shape: {wanted} does not hold the elements of dims "
                f"{[int(d) for d in tensor.dims]}"
            )
        model = [-1, *wanted] if batched else wanted
        self.reshapes[tensor.name] = {"client": client, "model": model}
        return model

    def _instances(self) -> dict[str, Any]:
        groups = list(self.config.instance_group)
        if not groups:
            return {}
        kinds = {group.kind for group in groups}
        if mc.ModelInstanceGroup.KIND_MODEL in kinds:
            raise PbtxtError("instance_group.kind: KIND_MODEL is not served")
        if kinds == {mc.ModelInstanceGroup.KIND_AUTO}:
            self.notes.append("instance_group.kind KIND_AUTO is served on the CPU")
            kinds = {mc.ModelInstanceGroup.KIND_CPU}
        for group in groups:
            for field in ("rate_limiter", "profile", "passive", "secondary_devices", "host_policy"):
                if is_set(group, field):
                    self.notes.append(f"instance_group.{field} is not used")
        if len(kinds - {mc.ModelInstanceGroup.KIND_AUTO}) > 1:
            raise PbtxtError(
                "instance_group: groups on the CPU and on GPUs at once are not served; "
                "a model runs on one kind of device"
            )
        count = sum(max(group.count, 1) * max(len(group.gpus), 1) for group in groups)
        if mc.ModelInstanceGroup.KIND_GPU not in kinds:
            return {"instances": count, "device": "cpu"}
        gpus = {gpu for group in groups for gpu in group.gpus}
        if not gpus:
            self.notes.append(
                "instance_group: KIND_GPU without gpus runs count instances in all, "
                "spread over the GPUs (Triton runs count on each GPU)"
            )
            return {"instances": count, "device": "cuda"}
        if len(gpus) > 1:
            raise PbtxtError(
                f"instance_group.gpus: instances on GPUs {sorted(gpus)} are not served; name one "
                "GPU, or none to spread the instances over all"
            )
        if any(gpu < 0 for gpu in gpus):
            raise PbtxtError(f"instance_group.gpus: {sorted(gpus)} holds a negative GPU index")
        return {"instances": count, "device": f"cuda:{gpus.pop()}"}

    def _scheduling(self, batched: bool) -> dict[str, Any]:
        config = self.config
        settings: dict[str, Any] = {}
        if config.HasField("dynamic_batching"):
            batching = config.dynamic_batching
            if batching.max_queue_delay_microseconds:
                settings["max_queue_delay_ms"] = batching.max_queue_delay_microseconds / 1000
            scheduling = self._queue_scheduling(batching)
            if scheduling:
                settings["scheduling"] = scheduling
            if batching.preserve_ordering:
                self.notes.append(
                    "dynamic_batching.preserve_ordering is not used: each request's answer goes "
                    "to its own caller as soon as it is ready"
                )
        elif batched and not config.HasField("sequence_batching"):
            self.notes.append(
                "max_batch_size > 0 without dynamic_batching: requests are still batched "
                "together when they arrive while the model is busy"
            )
        if config.HasField("sequence_batching"):
            settings.update(self._sequences())
        return settings

    def _queue_scheduling(self, batching: Any) -> dict[str, Any]:
        """dynamic_batching's priorities, queue policies and preferred sizes as a
        ``scheduling`` table (appliance/config/scheduling.py); {} when none is set."""
        table: dict[str, Any] = {}
        if batching.priority_levels:
            table["priority_levels"] = int(batching.priority_levels)
        if batching.default_priority_level:
            table["default_priority_level"] = int(batching.default_priority_level)
        if batching.preferred_batch_size:
            table["preferred_batch_sizes"] = [int(n) for n in batching.preferred_batch_size]
        if batching.HasField("default_queue_policy"):
            table["default_queue_policy"] = _queue_policy(batching.default_queue_policy)
        if batching.priority_queue_policy:
            table["priority_queue_policy"] = {
                str(level): _queue_policy(policy)
                for level, policy in sorted(batching.priority_queue_policy.items())
            }
        return table

    def _versions(self) -> dict[str, Any]:
        config = self.config
        if not config.HasField("version_policy"):
            return {}
        policy = config.version_policy
        choice = policy.WhichOneof("policy_choice")
        if choice == "all":
            return {"versions": "all"}
        if choice == "specific":
            versions = sorted({int(v) for v in policy.specific.versions})
            if not versions or versions[0] < 0:
                raise PbtxtError(
                    f"version_policy.specific.versions: expected version numbers, got {versions}"
                )
            return {"versions": versions}
        wanted = policy.latest.num_versions if choice == "latest" else 1
        if wanted <= 1:
            return {"versions": "latest"}
        present = sorted(
            int(child.name)
            for child in self.model_dir.iterdir()
            if child.name.isdigit() and child.is_dir()
        )
        return {"versions": present[-wanted:] or "latest"}

    def _parameters(self) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        for key, value in sorted(self.config.parameters.items()):
            if key == _THREADS_PARAMETER:
                try:
                    threads = int(value.string_value)
                except ValueError:
                    threads = 0
                if threads < 1:
                    raise PbtxtError(
                        f"parameters[{key}]: expected a whole number >= 1, got "
                        f"{value.string_value!r}"
                    )
                settings["threads"] = threads
            else:
                self.notes.append(f"parameters[{key}] is not used")
        return settings


def _count(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _queue_policy(policy: Any) -> dict[str, Any]:
    action = mc.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action).lower()
    return {
        "timeout_action": action,
        "default_timeout_us": int(policy.default_timeout_microseconds),
        "allow_timeout_override": bool(policy.allow_timeout_override),
        "max_queue_size": int(policy.max_queue_size),
    }


def as_json(path: Path) -> dict[str, Any]:
    """A config.pbtxt as Triton's JSON of its ModelConfig (field names as in the
    proto, enums by name, every field, 64-bit integers as numbers), the form a
    Python-backend model's ``initialize`` gets in ``args["model_config"]``.

    Raises:
        PbtxtError: it is not a Triton model config.
    """
    config = _parse(path)
    data = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _integers(config.DESCRIPTOR, data)
    return data


_INT64 = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


def _integers(descriptor: Any, data: dict[str, Any]) -> None:
    """Turn the 64-bit integers protobuf's JSON writes as strings back into numbers."""
    for field in descriptor.fields:
        value = data.get(field.name)
        if value is None:
            continue
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            inner = message.fields_by_name["value"]
            if inner.message_type is not None:
                for item in value.values():
                    _integers(inner.message_type, item)
            elif inner.cpp_type in _INT64:
                data[field.name] = {key: int(item) for key, item in value.items()}
        elif message is not None:
            for item in value if isinstance(value, list) else [value]:
                _integers(message, item)
        elif field.cpp_type in _INT64:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
