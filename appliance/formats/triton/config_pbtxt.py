"""Triton's config.pbtxt, read into the settings a model directory's config.toml would hold.

A Triton model repository describes each model in ``config.pbtxt``: protobuf
text of Triton's ModelConfig (protos/triton_model_config.proto, parsed by
protobuf's own text format parser). :func:`read` maps what it means onto the
appliance's settings (appliance/formats/repository.py), field by field:

- ``platform`` / ``backend`` (read in platforms.py): onnxruntime_onnx (backend onnxruntime) and
  pytorch_libtorch (backend pytorch) pick their runtime; ``default_model_filename``
  names the file in each version directory;
- ``max_batch_size``, ``input`` and ``output`` (read in tensors.py; ``dims``
  exclude the batch dimension when max_batch_size > 0, as in Triton;
  TYPE_STRING is BYTES); an input's ``optional``; a tensor's ``reshape`` (the
  ``reshape`` option: worker/reshape.py);
- ``instance_group`` (read in instances.py): the counts, summed; KIND_CPU on the CPU, KIND_GPU on
  the listed GPU (``gpus`` with one GPU) or spread over all (no ``gpus``);
- ``dynamic_batching`` (read in batching.py): ``max_queue_delay_microseconds``, and its priorities,
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
from appliance.formats.triton.batching import BatchingFields
from appliance.formats.triton.instances import InstanceFields
from appliance.formats.triton.platforms import ENSEMBLE, PYTHON, platform_of
from appliance.formats.triton.sequences import PbtxtError as PbtxtError
from appliance.formats.triton.sequences import is_set
from appliance.formats.triton.tensors import TensorFields

FILE = "config.pbtxt"
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


class _Reader(BatchingFields, InstanceFields, TensorFields):
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
        platform = platform_of(config)
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
