"""The fuzz targets behind `make fuzz`, run briefly: seeds and mutations pass the oracle.

`make fuzz` runs the same targets for minutes each with atheris; this keeps
them working and catches the cheap finds in every `make test`. The KServe
gRPC target runs in a child process: its protobuf names clash with
tritonclient's in one process (see tools/fuzz/targets.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.fuzz import oracle
from tools.fuzz.targets import ISOLATED, TARGETS

ROOT = Path(__file__).resolve().parents[2]
IN_PROCESS = sorted(set(TARGETS) - ISOLATED)


@pytest.fixture(autouse=True, scope="module")
def _traced() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


@pytest.mark.parametrize("name", IN_PROCESS)
def test_every_seed_passes(name: str) -> None:
    seeds = TARGETS[name].seeds()
    assert seeds
    for seed in seeds:
        oracle.checked(TARGETS[name].run, seed)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_mutated_seeds_raise_only_the_protocols_errors(name: str) -> None:
    target = TARGETS[name]

    @settings(
        max_examples=oracle.examples(120),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(oracle.inputs(target.seeds(), target.words))
    def run(data: bytes) -> None:
        oracle.checked(target.run, data)

    run()


def test_the_oracle_catches_a_huge_allocation_and_lets_errors_through() -> None:
    def greedy(data: bytes) -> None:
        bytearray(oracle.ALLOC_SLACK + 1024 * len(data) + 1)

    with pytest.raises(oracle.Misbehaved, match="peak"):
        oracle.checked(greedy, b"x")

    def buggy(data: bytes) -> None:
        raise IndexError(data)

    with pytest.raises(IndexError):
        oracle.checked(buggy, b"x")


@given(oracle.mutated([b'{"a": [1, 2]}', b"\x00\x01"], ["word"]))
@settings(max_examples=50, database=None)
def test_mutations_are_bytes(data: bytes) -> None:
    assert isinstance(data, bytes)


def test_the_isolated_target_runs_in_its_own_process(tmp_path: Path) -> None:
    # Seeds are made here (with tritonclient); the child never imports it.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ISOLATED:
        out = tmp_path / name
        command = [sys.executable, "-m", "tools.fuzz.run"]
        seeds = [*command, "--write-seeds", name, str(out / "seeds")]
        subprocess.run(seeds, cwd=ROOT, env=env, check=True, timeout=120)
        assert list((out / "seeds").iterdir())
        worker = [*command, "--worker", name, "--engine", "hypothesis", "--seconds", "3"]
        done = subprocess.run(
            [*worker, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, timeout=180
        )
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        assert b"executions:" in done.stdout


@pytest.mark.parametrize("length", [0, 1, 7])
def test_targets_accept_empty_and_tiny_inputs(length: int) -> None:
    for name in IN_PROCESS:
        oracle.checked(TARGETS[name].run, bytes(range(length)))


@given(st.sampled_from(IN_PROCESS), st.binary(min_size=1, max_size=64))
@settings(max_examples=60, database=None, deadline=None)
def test_seeds_with_junk_appended(name: str, junk: bytes) -> None:
    for seed in TARGETS[name].seeds()[:2]:
        oracle.checked(TARGETS[name].run, seed + junk)
