"""The response cache: answers to repeated requests, kept in each frontend process.

A model opts in (config.pbtxt's ``response_cache { enable: true }``, or
``response_cache = true`` in its config.toml or options); the server gives
the cache its size (``server.response_cache_bytes``, per frontend process;
``--cache-config local,size=N`` under ``appliance serve --model-repository``).
A hit answers from here, never reaching a model worker, for every protocol.

The key is the model and its version, every input's name, datatype, shape
and bytes, the outputs asked for and the request's parameters (which a model
may read: Triton leaves them out of its key, and answers a request that
differs only in them from the cache). Inputs in a client's shared memory
(system or CUDA) and outputs written into it bypass the cache, as do
ensembles, streams and sequences. Entries are copies of the outputs, owned
by the cache; the least recently used go first, so the bytes held never pass
the size.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from appliance.client.result import InferResult
from appliance.core import dtypes
from appliance.core.tensor import Tensor
from appliance.observability.metrics import record_cache

OPTION = "response_cache"
# What an entry costs beyond its outputs' bytes (the key, the dict, the arrays).
ENTRY_OVERHEAD = 256
Entry = dict[str, npt.NDArray[Any]]


class ResponseCache:
    """An LRU of outputs by request key, at most ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[Entry, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def key(
        self,
        model: str,
        versions: Sequence[str],
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None,
    ) -> bytes | None:
        """The request's key; None when it cannot be cached (inputs not in memory)."""
        digest = hashlib.blake2b(digest_size=20)
        head = [model, list(versions), sorted(outputs) if outputs is not None else None]
        try:
            digest.update(orjson.dumps([*head, parameters or {}], option=orjson.OPT_SORT_KEYS))
        except TypeError:
            return None
        for name in sorted(inputs):
            array = _array_of(inputs[name])
            if array is None:
                return None
            kind = array.dtype.str if array.dtype != object else "BYTES"
            digest.update(orjson.dumps([name, kind, list(array.shape)]))
            if array.dtype == object:
                digest.update(dtypes.pack_bytes(array))
            else:
                digest.update(np.ascontiguousarray(array).data)
        return digest.digest()

    def get(self, model: str, key: bytes, started: float) -> InferResult | None:
        """The cached answer, counted as a hit (or None, not counted: see :meth:`put`)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
        if found is None:
            return None
        outputs = {name: Tensor.from_array(array) for name, array in found[0].items()}
        record_cache(model, hit=True, seconds=time.perf_counter() - started)
        return InferResult(outputs, None)

    def put(self, model: str, key: bytes, result: InferResult, seconds: float) -> None:
        """Keep a copy of a fresh answer; count the miss with its lookup and insertion time."""
        started = time.perf_counter()
        entry = {name: _owned(tensor) for name, tensor in result.outputs.items()}
        size = ENTRY_OVERHEAD + sum(array.nbytes for array in entry.values())
        if size <= self.capacity:
            with self._lock:
                old = self._entries.pop(key, None)
                if old is not None:
                    self.used -= old[1]
                while self._entries and self.used + size > self.capacity:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self.used -= dropped
                    self.evictions += 1
                self._entries[key] = (entry, size)
                self.used += size
        record_cache(model, hit=False, seconds=seconds + time.perf_counter() - started)


def _array_of(value: Any) -> npt.NDArray[Any] | None:
    """An input's array, if it lies in this process's memory."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Tensor):
        return value.array()
    return None


def _owned(tensor: Tensor) -> npt.NDArray[Any]:
    """A copy of an output: the result's tensors are views of a ring the worker reuses."""
    array = np.array(tensor.array(), copy=True)
    array.setflags(write=False)
    return array
