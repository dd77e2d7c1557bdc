"""The frontends' connection admission under RLIMIT_NOFILE, and the master's OOM watch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from appliance.frontends.descriptors import HEADROOM, Descriptors, open_descriptors
from appliance.master.oom import OomWatch, events_file, read_count


class Opened:
    """Descriptors standing in for connections: each admit() has one open."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def connect(self, descriptors: Descriptors) -> bool:
        self.fds.append(os.open("/dev/null", os.O_RDONLY))
        if descriptors.admit():
            return True
        os.close(self.fds.pop())
        return False

    def close_one(self, descriptors: Descriptors) -> None:
        os.close(self.fds.pop())
        descriptors.closed()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def test_connections_are_admitted_while_headroom_is_left_and_refused_after() -> None:
    descriptors = Descriptors("test", limit=open_descriptors() + HEADROOM + 2)
    opened = Opened()
    try:
        assert opened.connect(descriptors)
        assert opened.connect(descriptors)
        assert not opened.connect(descriptors)
        assert descriptors.refused == 1
        opened.close_one(descriptors)
        assert opened.connect(descriptors)
        assert descriptors.connections == 2
    finally:
        opened.close()


def test_a_refusal_is_logged_once_until_a_connection_is_admitted_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    descriptors = Descriptors("test", limit=open_descriptors() + HEADROOM)
    opened = Opened()
    try:
        for _ in range(5):
            assert not opened.connect(descriptors)
    finally:
        opened.close()
    warnings = [r for r in caplog.records if "at the descriptor limit" in r.getMessage()]
    assert len(warnings) == 1
    assert descriptors.refused == 5


def test_the_memory_cgroup_file_is_found_for_v1_and_v2(tmp_path: Path) -> None:
    v1 = tmp_path / "memory" / "box"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    found = events_file("4:memory:/box\n0::/\n", tmp_path)
    assert found == v1 / "memory.oom_control"
    assert read_count(found) == 3
    v2 = tmp_path / "v2"
    (v2 / "svc").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory\n")
    (v2 / "svc" / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert read_count(events_file("0::/svc\n", v2)) == 2
    assert events_file("0::/elsewhere\n", v2) is None


def test_an_oom_kill_is_seen_once(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("oom_kill 0\n")
    watch = OomWatch(events)
    assert not watch.killed_since()
    events.write_text("oom_kill 1\n")
    assert watch.killed_since()
    assert not watch.killed_since()
