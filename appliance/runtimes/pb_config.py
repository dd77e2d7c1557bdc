"""Triton's type names and ``pb_utils.ModelConfig``: a model config as Triton's Python
models see it (``auto_complete_config``), for python_backend_utils.py to export."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

# Triton's type names and TRITONSERVER_DataType numbers, and their numpy types.
_TYPES: tuple[tuple[str, int, Any], ...] = (
    ("TYPE_BOOL", 1, np.bool_),
    ("TYPE_UINT8", 2, np.uint8),
    ("TYPE_UINT16", 3, np.uint16),
    ("TYPE_UINT32", 4, np.uint32),
    ("TYPE_UINT64", 5, np.uint64),
    ("TYPE_INT8", 6, np.int8),
    ("TYPE_INT16", 7, np.int16),
    ("TYPE_INT32", 8, np.int32),
    ("TYPE_INT64", 9, np.int64),
    ("TYPE_FP16", 10, np.float16),
    ("TYPE_FP32", 11, np.float32),
    ("TYPE_FP64", 12, np.float64),
    ("TYPE_STRING", 13, np.object_),
)
TRITON_STRING_TO_NUMPY: dict[str, Any] = {name: numpy for name, _n, numpy in _TYPES}
_NUMBER_TO_NUMPY = {number: numpy for _name, number, numpy in _TYPES}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """The numpy type of a config's ``data_type`` ("TYPE_FP32" -> numpy.float32)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a TRITONSERVER_DataType number; None for an unknown one."""
    return _NUMBER_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType number of a numpy type; None for an unknown one."""
    if data_type in (np.object_, np.bytes_, bytes, str) or np.dtype(data_type).kind in "OSU":
        return 13
    wanted = np.dtype(data_type)
    for _name, number, numpy in _TYPES[:-1]:
        if np.dtype(numpy) == wanted:
            return number
    return None


class ModelConfig:
    """A model's config as ``auto_complete_config`` sees and completes it (Triton's JSON).

    Each setter refuses what contradicts what the config already says, as
    Triton's does, naming the field.
    """

    def __init__(self, model_config: str | Mapping[str, Any]) -> None:
        loaded = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._model_config: dict[str, Any] = dict(loaded)

    @property
    def _config(self) -> dict[str, Any]:
        return self._model_config

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._config.get("max_batch_size", 0))
        if current not in (0, max_batch_size):
            raise ValueError(
                f"configuration specified max_batch_size {current}, but auto-complete-config "
                f"function for model '{self._config.get('name', '')}' specified max_batch_size "
                f"{max_batch_size}"
            )
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        if not self._config.get("sequence_batching"):
            self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: Mapping[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        policy = self._config.setdefault("model_transaction_policy", {})
        for key, value in transaction_policy_dict.items():
            if key != "decoupled":
                raise ValueError(f"model transaction property {key!r} is not supported")
            if key in policy and policy[key] != value:
                raise ValueError(
                    f"model transaction policy {key} is {policy[key]} in the config, and the "
                    f"auto-complete-config function set it to {value}"
                )
            policy[key] = value

    def _add(self, kind: str, tensor: Mapping[str, Any]) -> None:
        entry = dict(tensor)
        unknown = set(entry) - {"name", "data_type", "dims", "optional"}
        if unknown:
            raise ValueError(
                f"{kind} {entry.get('name', '')!r}: {', '.join(sorted(unknown))}: only name, "
                "data_type, dims and optional may be set"
            )
        for key in ("name", "data_type", "dims"):
            if key not in entry:
                raise ValueError(f"{kind} {entry.get('name', '')!r} has no {key!r}")
        if entry["data_type"] not in TRITON_STRING_TO_NUMPY:
            raise ValueError(f"{kind} {entry['name']!r}: unknown data_type {entry['data_type']!r}")
        entry["dims"] = [int(d) for d in entry["dims"]]
        tensors = self._config.setdefault(kind, [])
        known = next((t for t in tensors if t.get("name") == entry["name"]), None)
        if known is None:
            tensors.append(entry)
            return
        for key in ("data_type", "dims"):
            if known.get(key) not in (None, [], entry[key]):
                raise ValueError(
                    f"{kind} {entry['name']!r}: {key} is {known[key]} in the config, and the "
                    f"auto-complete-config function set it to {entry[key]}"
                )
            known[key] = entry[key]
