"""What an instance refuses a request with before it runs (a full queue, a
method the model cannot answer), and what a model's exception becomes."""

from __future__ import annotations

import logging

from appliance.core.metadata import ModelMetadata
from appliance.errors import ApplianceError, ModelFailed, Overloaded, Unsupported

log = logging.getLogger("appliance.worker")
PREDICT, STREAM = "predict", "stream"


def unanswerable(metadata: ModelMetadata, method: str) -> ApplianceError | None:
    """Why this model cannot answer ``method`` (None: it can)."""
    supports = metadata.supports
    if method == STREAM and not supports.get("predict_stream"):
        return Unsupported(f"model {metadata.name} does not stream")
    if method == PREDICT and not supports.get("predict", True):
        return streams_only(metadata.name)
    return None


def as_error(model: str, ex: Exception) -> ApplianceError:
    """What a model's exception answers its request with."""
    if isinstance(ex, ApplianceError):
        return ex
    if isinstance(ex, NotImplementedError):
        return Unsupported(f"model {model} does not implement this method")
    log.exception("model %s raised", model)
    return ModelFailed(f"model {model} failed: {type(ex).__name__}: {ex}")


def streams_only(model: str) -> Unsupported:
    # Triton refuses it with 501 / UNIMPLEMENTED too; the words say where it does answer.
    return Unsupported(
        f"model {model} is decoupled (model_transaction_policy {{ decoupled: true }}): it "
        "answers over a stream only (KServe gRPC ModelStreamInfer, GRPS streaming), not a "
        "single inference"
    )


def queue_full(model: str, pid: int, queued: int, limit: int) -> Overloaded:
    return Overloaded(
        f"model {model} is overloaded: its instance (pid {pid}) already holds {queued} queued "
        f"requests, the limit (models[{model}].max_queue) is {limit}; retry later, or add "
        "instances"
    )


def too_many_pieces(
    model: str, pid: int, rows: int, pieces: int, max_rows: int, queued: int, limit: int
) -> Overloaded:
    return Overloaded(
        f"model {model} is overloaded: a request of {rows} rows runs as {pieces} batches of "
        f"at most {max_rows} rows, and its instance (pid {pid}) holds {queued} queued of at "
        f"most {limit} (models[{model}].max_queue); send fewer rows per request, or retry later"
    )
