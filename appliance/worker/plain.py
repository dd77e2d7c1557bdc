"""The common request, read and checked in one pass: the model worker's fast admission.

Most requests are a prediction whose inputs are numeric tensors, inline in
the descriptor or in the client's ring, each declared by the model, with no
sequence, priority, GPU or derivative fields, to a model without sequences
or priority levels. :class:`PlainRequests` turns such a
request into its :class:`Pending` in one pass over its tensor entries,
straight into arrays, with what the model's declarations allow worked out
once at load.

Anything else, and any request that fails a check here, is declined (None):
the general path (message_tensors.read_tensors, then batcher.check_request) takes
it from the start, so what is accepted and every error a client sees are the
general path's. This path only never builds what the general one would throw
away.

PERF: the general path costs an identity worker about 25 µs a request here
(a Tensor per input, the declarations looked up again, a second walk over the
entries for pass-through spans); this one a third of that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.core.descriptor import Message
from appliance.core.dtypes import DType, to_numpy
from appliance.core.message_tensors import SegmentReader
from appliance.core.metadata import ModelMetadata
from appliance.core.sequences import SEQUENCE_PARAMETERS
from appliance.worker.batcher import ANY_REQUEST, PREDICT, batch_key
from appliance.worker.passthrough import Span
from appliance.worker.pending import Pending
from appliance.worker.queueing import PRIORITY

# An input the fast path reads: its dtype's name, numpy dtype and declared shape.
Declared = tuple[str, np.dtype[Any], tuple[int, ...]]


class PlainRequests:
    """Admit plain predictions to one model in one pass.

    Args:
        metadata: the model's declarations; a model that declares no inputs
            (any named tensors) has no fast path.
        per_request: the model takes a batch's requests one by one.
        passthrough: note where inputs lie in shared memory (passthrough.py).
    """

    def __init__(self, metadata: ModelMetadata, per_request: bool, passthrough: bool) -> None:
        inputs = metadata.inputs or ()
        # BYTES inputs are unpacked and checked on the general path.
        self._declared: dict[str, Declared] = {
            spec.name: (spec.dtype.value, to_numpy(spec.dtype), spec.shape)
            for spec in inputs
            if spec.dtype is not DType.BYTES
        }
        self._required = frozenset(spec.name for spec in inputs if not spec.optional)
        outputs = metadata.outputs
        self._outputs = None if outputs is None else frozenset(spec.name for spec in outputs)
        self._max_batch_size = metadata.max_batch_size
        self._per_request = per_request
        self._passthrough = passthrough

    @classmethod
    def serving(
        cls, metadata: ModelMetadata, per_request: bool, passthrough: bool
    ) -> PlainRequests | None:
        """The fast path for a model, or None where every request takes the general one."""
        if metadata.inputs is None:
            return None
        return cls(metadata, per_request, passthrough)

    def take(self, message: Message, reader: SegmentReader) -> Pending | None:
        """The request as a Pending, or None: the general path must read it."""
        body = message.body
        fields = self._fields(body)
        if fields is None:
            return None
        read = self._read(body.get("tensors"), message.payloads, reader)
        if read is None:
            return None
        arrays, spans = read
        rows = self._rows(arrays)
        if rows < 0:
            return None
        parameters, outputs = fields
        key = None
        if rows:
            key = ANY_REQUEST if self._per_request else batch_key(arrays, parameters)
        pending = Pending(message, arrays, PREDICT, parameters, outputs, rows, key)
        sent = body.get("sent")
        if type(sent) is float and sent < pending.arrived:
            # Waiting in the socket while the instance was busy is waiting in its queue.
            pending.arrived = sent
        if spans:
            pending.spans = spans
        return pending

    def _fields(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[str] | None] | None:
        """A plain prediction's parameters and wanted outputs; None for any other body."""
        if body.get("method", PREDICT) != PREDICT or "targets" in body:
            return None
        parameters = body.get("params")
        if parameters is None:
            parameters = {}
        elif (
            type(parameters) is not dict
            or PRIORITY in parameters
            or not SEQUENCE_PARAMETERS.isdisjoint(parameters)
        ):
            return None
        outputs = body.get("outputs")
        if outputs is not None and not self._known_outputs(outputs):
            return None
        return parameters, outputs

    def _read(
        self, entries: Any, payloads: list[Any], reader: SegmentReader
    ) -> tuple[dict[str, Any], list[Span]] | None:
        """Each entry's array and (pass-through) where it lies; None if any is not plain."""
        if type(entries) is not list:
            return None
        arrays: dict[str, Any] = {}
        spans: list[Span] = []
        declared = self._declared
        for entry in entries:
            if type(entry) is not list or len(entry) != 4:
                return None
            name, dtype, shape, place = entry
            known = declared.get(name) if type(name) is str else None
            if known is None or dtype != known[0] or name in arrays:
                return None
            if not _fits(shape, known[2]):
                return None
            try:
                data = self._data(place, payloads, reader, spans)
                if data is None:
                    return None
                arrays[name] = np.frombuffer(data, dtype=known[1]).reshape(shape)
            except (ValueError, TypeError, IndexError, KeyError, OSError):
                return None
        if not self._required <= arrays.keys():
            return None
        if len(arrays) > 1:
            # In declared order, as the general path has them (batch keys depend on it).
            arrays = {name: arrays[name] for name in declared if name in arrays}
        return arrays, spans

    def _data(
        self, place: Any, payloads: list[Any], reader: SegmentReader, spans: list[Span]
    ) -> Any:
        """An input's bytes: inline, or viewed in a client's segment (noting where)."""
        if type(place) is int:
            return payloads[place] if place >= 0 else None
        if type(place) is not list or len(place) != 3:
            return None
        segment, offset, nbytes = place
        if type(segment) is not str or type(offset) is not int:
            return None
        data = reader.view(segment, offset, nbytes)
        if self._passthrough:
            start = reader.base(segment) + offset
            spans.append((start, start + nbytes, segment, offset))
        return data

    def _known_outputs(self, outputs: Any) -> bool:
        if type(outputs) is not list:
            return False
        names = self._outputs
        return all(type(name) is str and (names is None or name in names) for name in outputs)

    def _rows(self, arrays: dict[str, Any]) -> int:
        """The rows the request counts for in a batch; -1: the general path says why not."""
        if self._max_batch_size <= 0:
            return 0
        rows = -1
        for array in arrays.values():
            if array.ndim:
                first = array.shape[0]
                if rows >= 0 and first != rows:
                    return -1
                rows = first
        if rows > self._max_batch_size and self._per_request:
            return -1
        return max(rows, 0)


def _fits(shape: Any, declared: tuple[int, ...]) -> bool:
    """Whether a descriptor's shape is a list of sizes the declared shape allows."""
    if type(shape) is not list or len(shape) != len(declared):
        return False
    # PERF: indexed, not zip(strict=True): a call with a keyword cost more than the loop.
    for index in range(len(declared)):
        got, want = shape[index], declared[index]
        if type(got) is not int or got < 0 or (want != got and want != -1):
            return False
    return True
