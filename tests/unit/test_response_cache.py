"""The response cache's keys and its least-recently-used bound (appliance/client/cache.py)."""

from __future__ import annotations

import numpy as np

from appliance.client.cache import ENTRY_OVERHEAD, ResponseCache
from appliance.client.result import InferResult
from appliance.core.tensor import Tensor


def answer(nbytes: int) -> InferResult:
    return InferResult({"Y": Tensor.from_array(np.zeros(nbytes, np.uint8))}, None)


def key_of(cache: ResponseCache, x: object, **kwargs: object) -> bytes | None:
    request = {"outputs": None, "parameters": None, **kwargs}
    return cache.key("m", ["1"], {"X": x}, request["outputs"], request["parameters"])  # type: ignore[arg-type]


def test_a_key_holds_every_input_s_bytes_and_shape_the_outputs_and_the_parameters() -> None:
    cache = ResponseCache(1 << 20)
    x = np.arange(4, dtype=np.float32)
    base = key_of(cache, x)
    assert base == key_of(cache, x.copy())
    assert base != key_of(cache, x.reshape(2, 2))
    assert base != key_of(cache, x.astype(np.float64))
    assert base != key_of(cache, x + 1)
    assert base != key_of(cache, x, outputs=["Y"])
    assert base != key_of(cache, x, parameters={"p": 1})
    assert key_of(cache, np.array([b"a", b"bc"], dtype=object)) != key_of(
        cache, np.array([b"ab", b"c"], dtype=object)
    )
    # Not in this process's memory (a client's shared memory region): not cached.
    assert key_of(cache, object()) is None


def test_the_least_recently_used_answers_go_first_and_the_size_is_never_passed() -> None:
    entry = 1000 + ENTRY_OVERHEAD
    cache = ResponseCache(3 * entry)
    keys = [bytes([n]) for n in range(4)]
    for key in keys[:3]:
        cache.put("m", key, answer(1000), 0.0)
    assert cache.get("m", keys[0], 0.0) is not None  # now the most recent
    cache.put("m", keys[3], answer(1000), 0.0)
    assert cache.get("m", keys[1], 0.0) is None
    assert all(cache.get("m", k, 0.0) is not None for k in (keys[0], keys[2], keys[3]))
    assert cache.used == 3 * entry <= cache.capacity
    assert cache.evictions == 1
    # An answer larger than the whole cache is not kept.
    cache.put("m", b"big", answer(4 * entry), 0.0)
    assert cache.get("m", b"big", 0.0) is None
    assert cache.used <= cache.capacity


def test_a_hit_is_a_copy_the_worker_s_ring_cannot_change() -> None:
    cache = ResponseCache(1 << 20)
    source = np.arange(3, dtype=np.int64)
    cache.put("m", b"k", InferResult({"Y": Tensor.from_array(source)}, None), 0.0)
    source[:] = 0
    hit = cache.get("m", b"k", 0.0)
    assert hit is not None
    assert hit.array("Y").tolist() == [0, 1, 2]
