"""Model metadata: what a loaded model declares, as every frontend sees it.

A model worker writes ``<tree dir>/models/<name>.json`` once its model has
loaded; frontends read it, so metadata needs no round trip to a worker and
stays available while an instance restarts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from appliance.core.tensor import TensorSpec


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """A model's declared interface.

    ``inputs``/``outputs`` are None for a generic model that accepts any
    named tensors. Shapes include the batch dimension when
    ``max_batch_size`` > 0.
    """

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...] | None
    outputs: tuple[TensorSpec, ...] | None
    max_batch_size: int
    supports: dict[str, bool] = field(default_factory=dict)
    description: str = ""
    # A sequence model's control inputs and implicit state, in Triton's
    # model-config form (see worker/sequences.py); None for other models.
    sequence: dict[str, Any] | None = None
    # What KServe metadata lists beside the declared tensors (Model.listed_metadata).
    listed: dict[str, Any] = field(default_factory=dict)

    def input(self, name: str) -> TensorSpec | None:
        return _find(self.inputs, name)

    def output(self, name: str) -> TensorSpec | None:
        return _find(self.outputs, name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": list(self.versions),
            "platform": self.platform,
            "inputs": _specs_out(self.inputs),
            "outputs": _specs_out(self.outputs),
            "max_batch_size": self.max_batch_size,
            "supports": dict(self.supports),
            "description": self.description,
            "sequence": self.sequence,
            "listed": self.listed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelMetadata:
        return cls(
            name=str(data["name"]),
            versions=tuple(str(v) for v in data.get("versions", [])),
            platform=str(data.get("platform", "")),
            inputs=_specs_in(data.get("inputs")),
            outputs=_specs_in(data.get("outputs")),
            max_batch_size=int(data.get("max_batch_size", 0)),
            supports={str(k): bool(v) for k, v in data.get("supports", {}).items()},
            description=str(data.get("description", "")),
            sequence=data.get("sequence"),
            listed=dict(data.get("listed") or {}),
        )

    def write(self, path: Path) -> None:
        """Write atomically, so a reader never sees half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(f".{os.getpid()}.tmp")
        temp.write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))
        temp.replace(path)

    @classmethod
    def read(cls, path: Path) -> ModelMetadata:
        return cls.from_dict(orjson.loads(path.read_bytes()))


def _find(specs: tuple[TensorSpec, ...] | None, name: str) -> TensorSpec | None:
    for spec in specs or ():
        if spec.name == name:
            return spec
    return None


def _specs_out(specs: tuple[TensorSpec, ...] | None) -> list[dict[str, object]] | None:
    # KServe's tensor metadata has no "optional": only this file carries it.
    if specs is None:
        return None
    return [
        {**spec.to_dict(), "optional": True} if spec.optional else spec.to_dict() for spec in specs
    ]


def _specs_in(data: Any) -> tuple[TensorSpec, ...] | None:
    return None if data is None else tuple(TensorSpec.from_dict(item) for item in data)
