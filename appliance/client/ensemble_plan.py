"""An ensemble's plan: its steps in order, who reads what, and its declared metadata.

A plan is made once per declaration (ensemble.py keeps one per served
ensemble, an unchanged one kept across reloads) and read by every call of
it (ensemble_run.py). Apart from both: reading a declaration is done once,
running it on every call, and a run needs only what was planned.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from appliance.config.ensembles import order
from appliance.config.settings import ENSEMBLE, EnsembleConfig
from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import TensorSpec

_SUPPORTS = {"predict": True, "predict_stream": False}
_SUPPORTS |= dict.fromkeys(("gradient", "apply_jacobian", "apply_hessian"), False)


@dataclass(frozen=True, slots=True)
class Plan:
    """An ensemble made ready to run: its steps in order, and who reads what."""

    config: EnsembleConfig
    order: tuple[int, ...]
    # Ensemble tensor -> how many step inputs read it.
    readers: Mapping[str, int]
    # Step -> the outputs of its model that are read or are the ensemble's.
    wanted: Mapping[int, tuple[str, ...]]
    metadata: ModelMetadata

    @classmethod
    def of(cls, config: EnsembleConfig) -> Plan:
        readers: dict[str, int] = {}
        for step in config.steps:
            for tensor in step.input_map.values():
                readers[tensor] = readers.get(tensor, 0) + 1
        outputs = {name for name, _dtype, _shape in config.outputs}
        wanted = {
            index: tuple(
                name
                for name, tensor in step.output_map.items()
                if tensor in readers or tensor in outputs
            )
            for index, step in enumerate(config.steps)
        }
        metadata = ModelMetadata(
            name=config.name,
            versions=(config.version,),
            platform=ENSEMBLE,
            inputs=tuple(_spec(item) for item in config.inputs),
            outputs=tuple(_spec(item) for item in config.outputs),
            max_batch_size=config.max_batch_size,
            supports=dict(_SUPPORTS),
            description=config.description or f"ensemble of {len(config.steps)} steps",
        )
        return cls(config, tuple(order(config)), readers, wanted, metadata)

    @property
    def models(self) -> list[str]:
        """The steps' models, each once, in step order."""
        return list(dict.fromkeys(step.model for step in self.config.steps))


def _spec(item: tuple[str, str, tuple[int, ...]]) -> TensorSpec:
    return TensorSpec(item[0], DType(item[1]), item[2])
