"""How the master fits a config's rings into /dev/shm, and a ring without a segment."""

from __future__ import annotations

import os
from typing import Any

import pytest

from appliance.client.status_format import format_shm
from appliance.config.reader import from_dict
from appliance.config.settings import ApplianceConfig
from appliance.core.ring import Ring
from appliance.core.segment import Segment, Space, mib
from appliance.errors import ShmExhausted
from appliance.master import shm

MiB = 1 << 20


def config(models: int = 4, **shm_keys: Any) -> ApplianceConfig:
    entries = [{"name": f"m{i}", "class": "m:M"} for i in range(models)]
    entries[0]["response_ring_bytes"] = 128 * MiB
    sections = {"http": {"workers": 1}, "grpc": {"workers": 2}, "mip": {"workers": 2}}
    return from_dict({**sections, "shm": shm_keys, "models": entries}, "test")


def test_a_config_that_fits_keeps_every_ring_as_configured() -> None:
    fit = shm.fit(config(), Space(24 << 30, 24 << 30))
    assert (fit.cap, fit.refused, fit.message) == (0, False, "")
    # 5 frontends x 32 MiB, one 128 MiB ring and three of 32 MiB.
    assert fit.wanted == (5 * 32 + 128 + 3 * 32) * MiB


def test_a_small_dev_shm_caps_every_ring_at_an_equal_share_and_says_how_large_to_make_it() -> None:
    space = Space(64 * MiB, 64 * MiB)
    fit = shm.fit(config(), space, extra=4096)
    assert not fit.refused
    assert 1 * MiB <= fit.cap < 32 * MiB
    # At the cap, every ring (9 of them) fits with the reserve kept free.
    budget = space.free - space.free // shm.RESERVE_FRACTION - 4096
    assert 9 * fit.cap <= budget < 9 * (fit.cap + shm.ROUND)
    assert f"every ring is capped at {mib(fit.cap)}" in fit.message
    assert "--shm-size=" in fit.message


def test_rings_smaller_than_the_cap_keep_their_size() -> None:
    fit = shm.fit(config(request_ring_bytes=1 * MiB), Space(256 * MiB, 256 * MiB))
    # Five 1 MiB request rings leave the rest to the response rings.
    assert fit.cap > 32 * MiB


def test_without_room_for_the_smallest_rings_it_refuses_naming_what_to_change() -> None:
    fit = shm.fit(config(), Space(8 * MiB, 8 * MiB))
    assert fit.refused
    for words in ("8 MiB free of 8 MiB", "at least", "shm.min_ring_bytes", "--shm-size="):
        assert words in fit.message


def test_with_shrink_to_fit_off_a_config_that_does_not_fit_is_refused() -> None:
    fit = shm.fit(config(shrink_to_fit=False), Space(256 * MiB, 256 * MiB))
    assert fit.refused
    assert "shm.shrink_to_fit is off" in fit.message


@pytest.mark.parametrize(
    ("wanted", "size"), [(1, 64 * MiB), (100 * MiB, 128 * MiB), (500 * MiB, 576 * MiB)]
)
def test_the_recommended_size_holds_the_rings_and_the_reserve(wanted: int, size: int) -> None:
    recommended = shm.recommended_bytes(wanted)
    assert recommended == size
    assert recommended - recommended // shm.RESERVE_FRACTION >= wanted


def test_ctl_status_says_what_dev_shm_holds_and_any_cap() -> None:
    line = format_shm(
        {
            "total_bytes": 64 * MiB,
            "free_bytes": 30 * MiB,
            "tree_bytes": 34 * MiB,
            "ring_cap_bytes": 2 * MiB,
            "wanted_bytes": 832 * MiB,
        }
    )
    assert "/dev/shm 64 MiB, 30 MiB free; this appliance holds 34 MiB" in line
    assert "every ring capped at 2 MiB" in line
    assert "configured 832 MiB" in line


def test_a_ring_without_a_segment_spills_and_takes_one_once_there_is_room() -> None:
    name = f"appliance-unittest-p{os.getpid()}-regrow"
    room = [False]

    def regrow() -> Segment:
        if not room[0]:
            raise ShmExhausted("shared memory is full")
        return Segment.create(name, 64 << 10)

    ring = Ring(None, name, 1 << 20, 1 << 20, "test.ring", regrow=regrow)
    try:
        block = ring.alloc(100)
        assert block.segment != name  # a one-off segment
        assert ring.capacity == 0
        ring.release(block)
        room[0] = True
        ring._regrow_at = 0.0  # the next try is due
        block = ring.alloc(100)
        assert block.segment == name
        assert ring.capacity == 64 << 10
        ring.release(block)
    finally:
        ring.close()
