"""Run a model instance's warmup samples (appliance/config/warmup.py) before it is ready.

Each sample goes through the same checks as a client's request (names,
dtypes, shapes) and the model's outputs through the same checks as a
reply's; the first that fails fails the load, the sample named, as Triton
fails a model whose warmup fails. Nothing is counted in the statistics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from appliance.config import warmup
from appliance.core.tensor import Tensor
from appliance.errors import ApplianceError
from appliance.model import Request
from appliance.worker.batcher import check_inputs, check_outputs
from appliance.worker.loader import Loaded, LoadError
from appliance.worker.reshape import Reshapes

log = logging.getLogger(__name__)


def run(
    loaded: Loaded,
    options: Mapping[str, Any],
    model_dir: Path | None,
    reshapes: Reshapes | None = None,
) -> None:
    """Run the samples in ``options["warmup"]``, if any.

    Raises:
        LoadError: a sample cannot be built, is refused, or the model fails on it.
    """
    tables = options.get(warmup.OPTION)
    if not tables:
        return
    metadata = loaded.metadata
    where = f"model {metadata.name!r}: warmup"
    try:
        samples = warmup.read(tables, model_dir or Path("."), metadata.max_batch_size)
    except ValueError as ex:
        raise LoadError(f"{where}{ex}") from None
    streams = not loaded.model.supported().get("predict", True)
    batched = metadata.max_batch_size > 0
    started = time.monotonic()
    runs = 0
    for sample in samples:
        named = f"{where} sample {sample.name!r}"
        for _ in range(max(sample.count, 1)):
            try:
                arrays = sample.request(batched)
                run_once(loaded, arrays, sample.batch_size, streams, reshapes)
            except (ApplianceError, ValueError) as ex:
                raise LoadError(f"{named} failed: {ex}") from None
            except Exception as ex:
                raise LoadError(f"{named} failed: {type(ex).__name__}: {ex}") from ex
            runs += 1
    seconds = time.monotonic() - started
    log.info("warmed up: %d run(s) of %d sample(s) in %.3f s", runs, len(samples), seconds)


def run_once(
    loaded: Loaded,
    arrays: dict[str, Any],
    requests: int,
    streams: bool,
    reshapes: Reshapes | None = None,
) -> None:
    """Run ``requests`` copies of one request as one batch, checked as a client's are.

    Raises:
        ApplianceError: the inputs or the outputs do not fit the declarations.
        Exception: what the model raised.
    """
    metadata, model = loaded.metadata, loaded.model
    tensors = {name: Tensor.from_array(array) for name, array in arrays.items()}
    inputs = check_inputs(metadata, tensors)
    if reshapes is not None:
        inputs = reshapes.inputs(inputs, metadata.name)
    if streams:
        for _ in range(requests):
            for part in model.predict_stream(inputs, {}):
                check_outputs(metadata, part)
        return
    if model.per_request:
        for produced in model.predict_requests([Request(inputs, {}, None)] * requests):
            if isinstance(produced, Exception):
                raise produced
            check_outputs(
                metadata, reshapes.outputs(produced, metadata.name) if reshapes else produced
            )
        return
    if requests > 1:
        inputs = {name: np.concatenate([array] * requests) for name, array in inputs.items()}
    produced = model.predict(inputs, {})
    check_outputs(metadata, reshapes.outputs(produced, metadata.name) if reshapes else produced)
