"""A batch for a model that takes its requests one by one (``Model.per_request``).

Triton's Python backend gives ``execute`` the batch's requests as a list and
gets one response back per request. The worker then hands the model each
request's own inputs (views of shared memory, never concatenated) and checks
each result alone: a result that is an error, or outputs that do not fit the
model's declaration, fail that request only.

A sequence model's request carries its sequence's id and start/end flags
(Triton's ``correlation_id()`` and ``flags()``), its control inputs and its
state, as one row of its own; the state it returns is kept for the next step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.core.metadata import ModelMetadata
from appliance.core.output_parameters import carried
from appliance.core.sequences import FLAG_END, FLAG_START
from appliance.core.tensor import Tensor
from appliance.errors import ApplianceError, ModelFailed
from appliance.model import Model, Request
from appliance.worker.batcher import split_outputs
from appliance.worker.pending import Pending
from appliance.worker.reshape import Reshapes
from appliance.worker.sequences import Sequences


def run(
    model: Model,
    metadata: ModelMetadata,
    batch: list[Pending],
    reshapes: Reshapes | None = None,
    sequences: Sequences | None = None,
) -> list[dict[str, Tensor] | ApplianceError]:
    """Each request's outputs or its error, in the batch's order.

    Raises:
        Exception: what the model raised; it fails the whole batch.
    """
    name = metadata.name
    requests = [request_of(p, name, reshapes, sequences) for p in batch]
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
            results.append(_checked(metadata, result, pending, sequences))
    return results


def request_of(
    pending: Pending, name: str, reshapes: Reshapes | None, sequences: Sequences | None
) -> Request:
    """``pending`` as the model's Request: its own inputs (and, a sequence's step, its
    control inputs and state), its id, and its sequence's id and flags."""
    arrays = pending.arrays
    correlation_id: int | str = 0
    flags = 0
    if sequences is not None:
        arrays = sequences.inputs([pending], arrays)
        step = pending.step
        assert step is not None, "a sequence model's requests are admitted before they queue"
        correlation_id = step.live.id
        flags = FLAG_START * step.start | FLAG_END * step.end
    return Request(
        reshapes.inputs(arrays, name) if reshapes else arrays,
        pending.parameters,
        pending.outputs,
        str(pending.message.body.get("id", "")),
        correlation_id,
        flags,
    )


def _checked(
    metadata: ModelMetadata,
    outputs: Mapping[str, Any],
    pending: Pending,
    sequences: Sequences | None,
) -> dict[str, Tensor] | ApplianceError:
    try:
        # The state outputs are kept for the next step; the parameters stay the model's.
        kept = sequences.keep([pending], outputs) if sequences is not None else outputs
        return carried(outputs, split_outputs(metadata, kept, [pending])[0])
    except ApplianceError as ex:
        return ex
