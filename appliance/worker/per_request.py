"""A batch for a model that takes its requests one by one (``Model.per_request``).

Triton's Python backend gives ``execute`` the batch's requests as a list and
gets one response back per request. The worker then hands the model each
request's own inputs (views of shared memory, never concatenated) and checks
each result alone: a result that is an error, or outputs that do not fit the
model's declaration, fail that request only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.core.metadata import ModelMetadata
from appliance.core.output_parameters import carried
from appliance.core.tensor import Tensor
from appliance.errors import ApplianceError, ModelFailed
from appliance.model import Model, Request
from appliance.worker.batcher import split_outputs
from appliance.worker.pending import Pending
from appliance.worker.reshape import Reshapes


def run(
    model: Model, metadata: ModelMetadata, batch: list[Pending], reshapes: Reshapes | None = None
) -> list[dict[str, Tensor] | ApplianceError]:
    """Each request's outputs or its error, in the batch's order.

    Raises:
        Exception: what the model raised; it fails the whole batch.
    """
    name = metadata.name
    requests = [
        Request(
            reshapes.inputs(p.arrays, name) if reshapes else p.arrays,
            p.parameters,
            p.outputs,
            str(p.message.body.get("id", "")),
        )
        for p in batch
    ]
    produced = model.predict_requests(requests)
    if reshapes is not None:
        produced = [r if isinstance(r, Exception) else reshapes.outputs(r, name) for r in produced]
    results: list[dict[str, Tensor] | ApplianceError] = []
    for pending, result in zip(batch, produced, strict=True):
        if isinstance(result, ApplianceError):
            results.append(result)
        elif isinstance(result, Exception):
            results.append(ModelFailed(f"model {metadata.name} failed: {result}"))
        else:
            results.append(_checked(metadata, result, pending))
    return results


def _checked(
    metadata: ModelMetadata, outputs: Mapping[str, Any], pending: Pending
) -> dict[str, Tensor] | ApplianceError:
    try:
        return carried(outputs, split_outputs(metadata, outputs, [pending])[0])
    except ApplianceError as ex:
        return ex
