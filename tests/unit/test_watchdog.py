"""The hang watchdog's choice, and the config keys for queues, hangs and bodies."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from appliance.config import reader as config_reader
from appliance.config import settings as config
from appliance.core.status import Role, SlotState, StatusTable
from appliance.master.children import Child, ChildSpec
from appliance.master.watchdog import overdue

NAME = f"appliance-wdtest{os.getpid()}-status"


@pytest.fixture
def status() -> Iterator[StatusTable]:
    table = StatusTable.create(NAME, 4, os.getpid())
    yield table
    table.close()
    table.segment.unlink()


def child(slot: int, model: str, pid: int) -> Child:
    spec = ChildSpec("model", f"model[{model}#0]", slot, Role.MODEL, model=model)
    made = Child(spec)
    made.proc = SimpleNamespace(pid=pid)  # type: ignore[assignment]
    return made


def test_only_an_instance_busy_past_its_models_limit_is_overdue(status: StatusTable) -> None:
    now = time.monotonic()
    children = [child(0, "slow", 100), child(1, "slow", 101), child(2, "free", 102)]
    for slot, pid in ((0, 100), (1, 101), (2, 102)):
        status.assign(slot, Role.MODEL, "m")
        status.set_state(slot, SlotState.READY, pid)
    status.beat(0, busy_since=now - 5.0)  # hung
    status.beat(1, busy_since=now - 0.5)  # busy, within its limit
    status.beat(2, busy_since=now - 50.0)  # no limit for its model
    found = overdue(status, children, {"slow": 2.0, "free": None}, now)
    assert [(c.spec.slot, limit) for c, _busy, limit in found] == [(0, 2.0)]
    assert found[0][1] == pytest.approx(5.0)


def test_a_slot_written_by_another_process_is_not_trusted(status: StatusTable) -> None:
    now = time.monotonic()
    status.assign(0, Role.MODEL, "m")
    status.set_state(0, SlotState.READY, 999)  # an earlier instance's pid
    status.beat(0, busy_since=now - 5.0)
    assert overdue(status, [child(0, "slow", 100)], {"slow": 1.0}, now) == []
    status.set_state(0, SlotState.DEAD, 100)
    assert overdue(status, [child(0, "slow", 100)], {"slow": 1.0}, now) == []


def test_config_reads_the_limits_with_their_defaults() -> None:
    data = config.to_dict(config_reader.load())
    loaded = config_reader.from_dict(data, "x")
    assert loaded.http.max_body_bytes == 64 << 20
    assert all(m.max_queue == 1024 and m.max_busy_s is None for m in loaded.models)
    data["http"]["max_body_bytes"] = 1000
    data["models"][0].update(max_queue=3, max_busy_s=2)
    loaded = config_reader.from_dict(data, "x")
    assert (loaded.http.max_body_bytes, loaded.models[0].max_queue) == (1000, 3)
    assert loaded.models[0].max_busy_s == 2.0
    assert config_reader.from_dict(config.to_dict(loaded), "x") == loaded


@pytest.mark.parametrize(
    ("where", "key", "value", "message"),
    [
        ("models", "max_queue", 0, "models[0].max_queue: expected an integer >= 1, got 0"),
        ("models", "max_busy_s", 0, "models[0].max_busy_s: expected a number of seconds > 0"),
        ("models", "max_busy_s", "1", "models[0].max_busy_s: expected a number >= 0, got '1'"),
        ("http", "max_body_bytes", 0, "http.max_body_bytes: expected an integer >= 1"),
    ],
)
def test_config_refuses_bad_limits(where: str, key: str, value: object, message: str) -> None:
    data = config.to_dict(config_reader.load())
    target = data["models"][0] if where == "models" else data[where]
    target[key] = value
    with pytest.raises(config.ConfigError, match=re.escape(message)):
        config_reader.from_dict(data, "x")
