"""An ensemble's model configuration, in the shape of Triton's ModelConfig.

Triton answers an ensemble's config with its platform, its declared tensors
and its ``ensemble_scheduling`` steps, and none of a model's scheduling
(instance groups, batching): an ensemble has no instances of its own. Dims
leave out the batch dimension when max_batch_size > 0, as for a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Only their shapes: the client hands the protocols these (ModelClient.ensemble).
    from appliance.config.settings import Declared, EnsembleConfig

# Triton's platform name for an ensemble.
PLATFORM = "ensemble"


def ensemble_config(ensemble: EnsembleConfig) -> dict[str, Any]:
    batched = ensemble.max_batch_size > 0
    return {
        "name": ensemble.name,
        "platform": PLATFORM,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": ensemble.max_batch_size,
        "input": [_tensor(item, batched) for item in ensemble.inputs],
        "output": [_tensor(item, batched) for item in ensemble.outputs],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": step.model,
                    "model_version": str(step.version),
                    "input_map": dict(step.input_map),
                    "output_map": dict(step.output_map),
                }
                for step in ensemble.steps
            ]
        },
    }


def _tensor(item: Declared, batched: bool) -> dict[str, Any]:
    name, dtype, shape = item
    kind = "STRING" if dtype == "BYTES" else dtype
    dims = list(shape[1:] if batched else shape)
    return {"name": name, "data_type": f"TYPE_{kind}", "dims": dims}
