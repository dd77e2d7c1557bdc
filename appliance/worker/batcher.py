"""Dynamic batching: check requests, gather them into batches, split outputs.

Requests for a batchable model (``max_batch_size`` > 0) whose inputs have the
same trailing shapes and whose parameters are equal are concatenated along
the first dimension, up to ``max_batch_size`` rows; a prediction with more
rows is cut into pieces first (see pieces.py). Batching is natural: the
worker takes a batch whenever it is free, so a lone request runs at once and
the requests that arrived while the last batch ran form the next one.
``max_queue_delay`` (0 by default) is an extra wait for a batch to fill.
Everything else (streams, derivatives, unbatched models) runs one request at
a time, in arrival order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from appliance.core.descriptor import Message
from appliance.core.dtypes import DType, to_numpy
from appliance.core.metadata import ModelMetadata
from appliance.core.sequences import SEQUENCE_PARAMETERS, carries_sequence
from appliance.core.tensor import Tensor, TensorSpec
from appliance.errors import BadRequest, ModelFailed
from appliance.worker.pending import Pending

Array = npt.NDArray[Any]
PREDICT = "predict"
STREAM = "stream"
DERIVATIVES = ("gradient", "apply_jacobian", "apply_hessian")
METHODS = (PREDICT, STREAM, *DERIVATIVES)
SENS, VEC = "__sens__", "__vec__"
# The batch key of every prediction of a model that takes requests one by one.
ANY_REQUEST = "any request"


def check_request(
    metadata: ModelMetadata,
    message: Message,
    tensors: dict[str, Tensor],
    per_request: bool = False,
) -> Pending:
    """Check a request against the model's declarations and build its arrays.

    ``per_request``: the model takes a batch's requests one by one
    (Model.per_request), so any two predictions may share a batch, whatever
    their shapes and parameters.

    Raises:
        BadRequest: unknown method, names, dtypes, shapes or batch size.
    """
    body = message.body
    method = str(body.get("method", PREDICT))
    if method not in METHODS:
        raise BadRequest(f"unknown method {method!r}")
    parameters = body.get("params") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("request parameters must be a mapping")
    outputs = body.get("outputs")
    if outputs is not None:
        outputs = [str(name) for name in outputs]
        _check_output_names(metadata, outputs)
    extras = {name: tensors.pop(name) for name in (SENS, VEC) if name in tensors}
    arrays = check_inputs(metadata, tensors)
    rows = _rows(metadata, arrays, method, per_request)
    sequence = None
    if carries_sequence(parameters):
        # Steps of different sequences share batches (sequences.py keeps them apart).
        sequence = {k: v for k, v in parameters.items() if k in SEQUENCE_PARAMETERS}
        parameters = {k: v for k, v in parameters.items() if k not in SEQUENCE_PARAMETERS}
    key: Hashable | None = None
    if rows and method == PREDICT:
        key = ANY_REQUEST if per_request else batch_key(arrays, parameters)
    for name, tensor in extras.items():
        arrays[name] = _array(name, tensor)
    pending = Pending(message, arrays, method, parameters, outputs, rows, key)
    sent = body.get("sent")
    if isinstance(sent, float) and sent < pending.arrived:
        # Waiting in the socket while the instance was busy is waiting in its queue.
        pending.arrived = sent
    if sequence is not None:
        pending.sequence = sequence
    return pending


def _rows(metadata: ModelMetadata, arrays: dict[str, Array], method: str, per_request: bool) -> int:
    """The rows a request counts for in a batch (0: it batches with no other).

    Raises:
        BadRequest: its inputs disagree on the rows, or it has more than the model
            takes at once where it cannot be cut into pieces.
    """
    batch = metadata.max_batch_size
    if batch <= 0:
        return 0
    if metadata.inputs is None:
        # A model that declares no tensors and takes its requests one by one (an
        # MLServer runtime) counts requests, not rows, as MLServer's batcher does.
        return 1 if per_request else 0
    rows = _batch_rows(metadata, arrays)
    if rows > batch and per_request:
        # Its execute sees requests whole, so a request is not cut into
        # pieces: refused, as Triton refuses it.
        raise BadRequest(
            f"inference request batch-size must be <= {batch} for "
            f"'{metadata.name}' (this request has {rows} rows)"
        )
    if rows > batch and method != PREDICT:
        raise BadRequest(
            f"model {metadata.name}: a {method} request of {rows} rows exceeds its "
            f"max_batch_size of {batch} (only predictions are split into batches); send "
            "at most that many rows"
        )
    return rows


def _check_output_names(metadata: ModelMetadata, names: list[str]) -> None:
    if metadata.outputs is None:
        return
    declared = [spec.name for spec in metadata.outputs]
    for name in names:
        if name not in declared:
            raise BadRequest(
                f"model {metadata.name} has no output named {name!r}; "
                f"its outputs are {', '.join(declared)}"
            )


def check_inputs(metadata: ModelMetadata, tensors: dict[str, Tensor]) -> dict[str, Array]:
    if metadata.inputs is None:
        return {name: _array(name, tensor) for name, tensor in tensors.items()}
    declared = {spec.name: spec for spec in metadata.inputs}
    for name in tensors:
        if name not in declared:
            raise BadRequest(
                f"model {metadata.name} has no input named {name!r}; "
                f"its inputs are {', '.join(declared)}"
            )
    arrays = {}
    for name, spec in declared.items():
        tensor = tensors.get(name)
        if tensor is None:
            if spec.optional:
                continue
            raise BadRequest(
                f"model {metadata.name}: missing input {name!r} ({_expects(declared)})"
            )
        _check_spec(metadata.name, spec, tensor)
        arrays[name] = _array(name, tensor)
    return arrays


def _expects(declared: dict[str, TensorSpec]) -> str:
    required = [name for name, spec in declared.items() if not spec.optional]
    optional = [name for name, spec in declared.items() if spec.optional]
    said = f"it expects {', '.join(required)}"
    return f"{said}; {', '.join(optional)} optional" if optional else said


def _check_spec(model: str, spec: TensorSpec, tensor: Tensor) -> None:
    if tensor.dtype is not spec.dtype:
        raise BadRequest(
            f"model {model} input {spec.name}: expected datatype {spec.dtype.value}, "
            f"got {tensor.dtype.value}"
        )
    if not spec.matches_shape(tensor.shape):
        raise BadRequest(
            f"model {model} input {spec.name}: shape {list(tensor.shape)} does not match "
            f"the declared shape {list(spec.shape)} (-1 means any size)"
        )


def _array(name: str, tensor: Tensor) -> Array:
    try:
        return tensor.array()
    except ValueError as ex:
        raise BadRequest(f"input {name}: {ex}") from None


def _batch_rows(metadata: ModelMetadata, arrays: dict[str, Array]) -> int:
    rows = {name: array.shape[0] for name, array in arrays.items() if array.ndim > 0}
    counts = set(rows.values())
    if len(counts) > 1:
        detail = ", ".join(f"{name}: {count}" for name, count in rows.items())
        raise BadRequest(
            f"model {metadata.name}: inputs disagree on the batch size (first dimension): {detail}"
        )
    return counts.pop() if counts else 0


def batch_key(arrays: dict[str, Array], parameters: dict[str, Any]) -> Hashable:
    """Requests with equal keys can share a batch: same trailing shapes and parameters."""
    shapes = tuple((name, array.shape[1:]) for name, array in arrays.items())
    params = orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS) if parameters else b""
    return (shapes, params)


class Batcher:
    """A queue of pending requests, in arrival order within each rank (priority),
    that hands out due batches.

    ``preferred``: batch sizes (ascending) sent as soon as the queue holds one,
    before the queue delay is over (Triton's preferred_batch_size).
    """

    def __init__(
        self, max_batch_size: int, max_queue_delay_s: float, preferred: tuple[int, ...] = ()
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_delay = max_queue_delay_s
        self.preferred = preferred
        self.queue: deque[Pending] = deque()

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, pending: Pending) -> None:
        queue = self.queue
        if not queue or queue[-1].rank <= pending.rank:
            queue.append(pending)
            return
        # Behind every request of its rank or a better one, ahead of the rest.
        for index, item in enumerate(queue):
            if item.rank > pending.rank:
                queue.insert(index, pending)
                return

    def expire(self, now: float) -> list[Pending]:
        """Requests whose wait ran out: those to refuse are removed and returned;
        those to delay go behind the requests of their level still in time."""
        late = [item for item in self.queue if item.expires and item.expires <= now]
        if not late:
            return []
        refused = [item for item in late if not item.delay]
        for item in late:
            item.expires = 0.0
            item.rank += item.delay
        kept = [item for item in self.queue if not any(item is r for r in refused)]
        self.queue = deque(sorted(kept, key=lambda item: item.rank))
        return refused

    def wait_s(self, now: float) -> float | None:
        """Return seconds until the next batch is due; None if nothing waits."""
        if not self.queue:
            return None
        head = self.queue[0]
        if head.key is None:
            return 0.0
        rows = self._rows_like(head)
        if rows >= self.max_batch_size or (self.preferred and rows >= self.preferred[0]):
            return 0.0
        return max(0.0, head.arrived + self.max_delay - now)

    def take(self, now: float) -> list[Pending]:
        """Remove and return the next batch if it is due, else []."""
        wait = self.wait_s(now)
        if wait is None or wait > 0:
            return []
        head = self.queue.popleft()
        if head.key is None:
            return [head]
        batch, keep, admit = [head], deque[Pending](), self._admitter(head, now)
        while self.queue:
            item = self.queue.popleft()
            # Every item is shown to admit, in queue order, so that it can
            # keep track of what it has passed over.
            (batch if admit(item) else keep).append(item)
        self.queue = keep
        return self._ordered(batch)

    def _admitter(self, head: Pending, now: float) -> Callable[[Pending], bool]:
        """Return what decides, item by item, who joins ``head``'s batch."""
        rows = head.rows
        limit = self._limit(head, now)

        def admit(item: Pending) -> bool:
            nonlocal rows
            if item.key != head.key or rows + item.rows > limit:
                return False
            rows += item.rows
            return True

        return admit

    def _limit(self, head: Pending, now: float) -> int:
        """The rows of the next batch: the largest preferred size the queue fills
        while the head's delay runs, else max_batch_size."""
        if not self.preferred or now >= head.arrived + self.max_delay:
            return self.max_batch_size
        rows = head.rows + self._rows_like(head)
        filled = [size for size in self.preferred if size <= rows]
        return filled[-1] if filled else self.max_batch_size

    def _ordered(self, batch: list[Pending]) -> list[Pending]:
        return batch

    def _rows_like(self, head: Pending) -> int:
        return sum(item.rows for item in self.queue if item.key == head.key)

    def drop(self, predicate: Any) -> list[Pending]:
        """Remove and return the pending requests ``predicate`` selects."""
        dropped = [item for item in self.queue if predicate(item)]
        if dropped:
            self.queue = deque([item for item in self.queue if not predicate(item)])
        return dropped


def batch_inputs(batch: list[Pending]) -> dict[str, Array]:
    """Concatenate a batch's inputs; a batch of one is passed through as views."""
    if len(batch) == 1:
        return batch[0].arrays
    return {name: np.concatenate([item.arrays[name] for item in batch]) for name in batch[0].arrays}


def split_outputs(
    metadata: ModelMetadata, produced: Mapping[str, Any], batch: list[Pending]
) -> list[dict[str, Tensor]]:
    """Check a model's outputs and cut them into one set per request.

    Raises:
        ModelFailed: an output is missing, of the wrong type or shape, or
            has the wrong number of rows for the batch.
    """
    if type(produced) is not dict and not isinstance(produced, Mapping):
        raise ModelFailed(
            f"model {metadata.name} returned {type(produced).__name__}, expected a mapping "
            "of output names to arrays"
        )
    arrays = check_outputs(metadata, produced)
    if len(batch) == 1 and (batch[0].key is None or metadata.outputs is None):
        return [_select(metadata, arrays, batch[0].outputs)]
    total = sum(item.rows for item in batch)
    for name, array in arrays.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ModelFailed(
                f"model {metadata.name} output {name} has shape {list(array.shape)}, expected "
                f"{total} rows for a batch of {total}"
            )
    results, start = [], 0
    for item in batch:
        stop = start + item.rows
        rows = {n: a[start:stop] for n, a in arrays.items()}
        results.append(_select(metadata, rows, item.outputs))
        start = stop
    return results


def check_outputs(metadata: ModelMetadata, produced: Mapping[str, Any]) -> dict[str, Array]:
    if metadata.outputs is None:
        return {str(name): np.asarray(value) for name, value in produced.items()}
    arrays = {}
    for spec in metadata.outputs:
        if spec.name not in produced:
            raise ModelFailed(f"model {metadata.name} did not return its output {spec.name}")
        arrays[spec.name] = conform(metadata.name, spec, produced[spec.name])
    return arrays


def conform(model: str, spec: TensorSpec, value: Any) -> Array:
    want = to_numpy(spec.dtype)
    if type(value) is np.ndarray and value.dtype == want and spec.matches_shape(value.shape):
        return value  # PERF: what most models return, checked in three steps
    array = np.asarray(value)
    if spec.dtype is DType.BYTES:
        if array.dtype.kind not in "OSU":
            raise ModelFailed(
                f"model {model} output {spec.name}: expected BYTES (str or bytes), got "
                f"{array.dtype}"
            )
        array = array.astype(object) if array.dtype != object else array
    else:
        if array.dtype != want:
            if not np.can_cast(array.dtype, want, casting="same_kind"):
                raise ModelFailed(
                    f"model {model} output {spec.name}: cannot convert {array.dtype} to "
                    f"{spec.dtype.value} safely"
                )
            array = array.astype(want)
    if not spec.matches_shape(array.shape):
        raise ModelFailed(
            f"model {model} output {spec.name}: shape {list(array.shape)} does not match "
            f"the declared {list(spec.shape)}"
        )
    return array


def _select(
    metadata: ModelMetadata, arrays: dict[str, Array], names: list[str] | None
) -> dict[str, Tensor]:
    """The outputs a request asked for (all when ``names`` is None), as tensors."""
    chosen = arrays if names is None else {name: arrays[name] for name in names if name in arrays}
    specs = metadata.outputs
    if specs is None:
        return {name: Tensor.from_array(array) for name, array in chosen.items()}
    # check_outputs gave each declared output its declared dtype.
    dtypes = {spec.name: spec.dtype for spec in specs}
    return {name: Tensor(dtypes[name], array.shape, array) for name, array in chosen.items()}
