"""Run one batch through the model: its inputs as the model takes them, its outputs
checked and cut into one set per request (batcher.py, per_request.py)."""

from __future__ import annotations

from appliance.core.metadata import ModelMetadata
from appliance.core.output_parameters import carried, has_parameters
from appliance.core.tensor import Tensor
from appliance.errors import ApplianceError
from appliance.model import Model
from appliance.worker import per_request
from appliance.worker.batcher import batch_inputs, split_outputs
from appliance.worker.client_gpu import ClientGpu
from appliance.worker.pending import Pending
from appliance.worker.reshape import Reshapes
from appliance.worker.sequences import Sequences


def results(
    model: Model,
    metadata: ModelMetadata,
    batch: list[Pending],
    sequences: Sequences | None,
    cuda: ClientGpu | None,
    reshapes: Reshapes | None,
) -> list[dict[str, Tensor] | ApplianceError]:
    """Each request's outputs, or (a per-request model) its error.

    Raises:
        Exception: what the model raised; it fails the whole batch.
    """
    if model.per_request:
        return per_request.run(model, metadata, batch, reshapes, sequences)
    inputs = batch_inputs(batch)
    if sequences is not None:
        inputs = sequences.inputs(batch, inputs)
    if reshapes is not None:
        inputs = reshapes.inputs(inputs, metadata.name)
    produced = model.predict(inputs, batch[0].parameters)
    if reshapes is not None:
        produced = reshapes.outputs(produced, metadata.name)
    if cuda is not None:
        produced = cuda.off_gpu(batch, produced)
    if sequences is not None:
        produced = sequences.keep(batch, produced)
    split = split_outputs(metadata, produced, batch)
    if has_parameters(produced):
        return [carried(produced, outputs) for outputs in split]
    return list(split)
