"""What every fuzz run checks beyond "no unexpected exception", and how inputs are mutated.

A decoder may use memory in proportion to its input (JSON turns a two-byte
``0,`` into a Python int and an array element), never in proportion to what
the input *claims* (a shape, a length field, an item count): the traced
peak must stay under ``ALLOC_FACTOR`` times the input plus ``ALLOC_SLACK``.
A single input must also finish well inside ``TIME_LIMIT_S``.

tracemalloc sees Python objects and numpy buffers, which is where a claimed
size would be allocated; it must be started before :func:`checked` runs.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Callable, Sequence

from hypothesis import strategies as st

ALLOC_FACTOR = 64
ALLOC_SLACK = 16 << 20
TIME_LIMIT_S = 10.0


def examples(default: int) -> int:
    """Hypothesis examples per property: ``default``, or FUZZ_EXAMPLES for a longer run."""
    return int(os.environ.get("FUZZ_EXAMPLES", default))


class Misbehaved(AssertionError):
    """A decoder used far more memory or time than its input warrants."""


def checked(run: Callable[[bytes], None], data: bytes) -> None:
    """Run a target on ``data``; raise Misbehaved on a huge allocation or a near-hang."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    start = time.monotonic()
    run(data)
    elapsed = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1] - base
    limit = ALLOC_FACTOR * len(data) + ALLOC_SLACK
    if peak > limit:
        raise Misbehaved(f"{len(data)} input bytes made a {peak}-byte peak (limit {limit})")
    if elapsed > TIME_LIMIT_S:
        raise Misbehaved(f"{len(data)} input bytes took {elapsed:.1f} s")


# Values that tend to break length and count fields, as u32/u16 big- and little-endian.
_NUMBERS = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x10000)
# Text that tends to break JSON readers and tensor checks.
_TOKENS = (
    b"-1",
    b"1e400",
    b"NaN",
    b"-0.0",
    b"18446744073709551616",
    b"9223372036854775808",
    b"4294967295",
    b"1.5",
    b"null",
    b"true",
    b'""',
    b"[]",
    b"{}",
    b"[" * 2000,
    b"\xff\xfe",
    b'"\\ud800"',
)


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[bytes], words: Sequence[str] = ()) -> bytes:
    """A seed changed in one to four places: bits, bytes, cuts, inserts, numbers, tokens."""
    data = bytearray(draw(st.sampled_from(list(seeds))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 5))
        at = draw(st.integers(0, len(data)))
        if op == 0 and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == 1 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == 2:
            del data[at : at + draw(st.integers(1, 64))]
        elif op == 3:
            data[at:at] = draw(st.binary(max_size=16))
        elif op == 4:
            number = draw(st.sampled_from(_NUMBERS))
            width, order = draw(st.sampled_from([(4, "big"), (4, "little"), (2, "big")]))
            data[at : at + width] = (number & ((1 << 8 * width) - 1)).to_bytes(width, order)
        else:
            token = draw(st.sampled_from([*_TOKENS, *(word.encode() for word in words)]))
            data[at : at + draw(st.integers(0, len(token)))] = token
    return bytes(data)


def inputs(seeds: Sequence[bytes], words: Sequence[str] = ()) -> st.SearchStrategy[bytes]:
    """Mutated seeds mostly, and some bytes from nowhere."""
    return st.one_of(mutated(seeds, words), mutated(seeds, words), st.binary(max_size=512))
