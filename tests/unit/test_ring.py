"""The ring allocator: no overlap, full reuse, spills and their limits."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.core.ring import Block, Ring, is_spill
from appliance.core.segment import SHM_DIR, Segment
from appliance.errors import Overloaded, TooLarge

NAME = f"appliance-unittest-p{os.getpid()}"


def make(size: int = 4096, max_tensor: int = 1 << 20, spill: int = 1 << 20) -> Ring:
    name = f"{NAME}-ring{size}"
    return Ring(Segment.create(name, size), name, max_tensor, spill, "test.ring")


@settings(max_examples=60)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 1500)), max_size=60))
def test_live_blocks_never_overlap_and_all_space_returns(ops: list[tuple[bool, int]]) -> None:
    ring = make()
    live: list[Block] = []
    try:
        for free_one, size in ops:
            if free_one and live:
                ring.release(live.pop(size % len(live)))
                continue
            block = ring.alloc(size)
            ring.view(block)[:] = bytes([len(live) % 251]) * size
            live.append(block)
        in_ring = sorted((b.offset, b.offset + b.nbytes) for b in live if not is_spill(b.segment))
        for (_, end), (start, _) in itertools.pairwise(in_ring):
            assert end <= start
        for block in live:
            ring.release(block)
        assert ring.used_bytes == 0
        assert ring.spilled_bytes == 0
        assert ring.alloc(4096).offset == 0
    finally:
        ring.close()


def test_a_block_larger_than_the_ring_spills_and_is_unlinked_on_release() -> None:
    ring = make()
    try:
        block = ring.alloc(10_000)
        assert is_spill(block.segment)
        assert (SHM_DIR / block.segment).exists()
        ring.release(block)
        assert not (SHM_DIR / block.segment).exists()
    finally:
        ring.close()


def test_limits_name_their_setting() -> None:
    ring = make(max_tensor=8192, spill=12_000)
    try:
        with pytest.raises(TooLarge, match=r"shm\.max_tensor_bytes"):
            ring.alloc(8193)
        ring.alloc(8000)
        with pytest.raises(Overloaded, match=r"raise test\.ring"):
            ring.alloc(8000)
    finally:
        ring.close()


def test_close_unlinks_everything() -> None:
    ring = make()
    spill = ring.alloc(9000)
    ring.close()
    assert not (SHM_DIR / ring.segment.name).exists()
    assert not (SHM_DIR / spill.segment).exists()
