"""What an instance refuses a request with before it runs: a full queue, or
an inference a streaming-only model cannot answer."""

from __future__ import annotations

from appliance.errors import Overloaded, Unsupported


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
