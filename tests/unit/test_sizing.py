"""What "auto" means: process counts sized to the CPUs a process may use."""

from __future__ import annotations

import pytest

from appliance.config import sizing
from appliance.config.reader import from_dict


@pytest.mark.parametrize(
    ("affinity", "cpu_max", "expected"),
    [
        (16, "", 16),  # no cgroup v2 file
        (16, "max 100000\n", 16),  # no quota
        (16, "400000 100000\n", 4),  # a 4-CPU container limit on a 16-CPU host
        (16, "150000 100000\n", 2),  # 1.5 CPUs round up
        (2, "800000 100000\n", 2),  # the affinity is the smaller
        (1, "50000 100000\n", 1),
    ],
)
def test_usable_cpus_is_the_affinity_capped_by_the_quota(
    affinity: int, cpu_max: str, expected: int
) -> None:
    assert sizing.usable_cpus(affinity, cpu_max) == expected


@pytest.mark.parametrize(
    ("cpus", "http", "grpc", "mip", "instances"),
    [
        (1, 1, 2, 2, 1),
        (2, 1, 2, 2, 1),
        (3, 1, 2, 2, 1),
        (4, 2, 2, 2, 1),
        (8, 4, 2, 2, 2),
        (16, 8, 4, 2, 4),
        (128, 16, 8, 4, 16),
    ],
)
def test_grpc_and_mip_run_two_processes_at_least_and_every_count_grows_with_the_host(
    cpus: int, http: int, grpc: int, mip: int, instances: int
) -> None:
    got = [sizing.auto(setting, cpus) for setting in sizing.RULES]
    assert got == [http, grpc, mip, instances]


def test_auto_is_the_default_and_a_number_wins() -> None:
    models = [
        {"name": "a", "class": "m:A", "instances": "auto"},
        {"name": "b", "class": "m:B", "instances": 3},
    ]
    config = from_dict({"server": {"cpus": 16}, "grpc": {"workers": 1}, "models": models}, "x")
    assert (config.http.workers, config.grpc.workers, config.mip.workers) == (8, 1, 2)
    assert [model.instances for model in config.models] == [4, 3]
    assert config.auto == ("models.a.instances", "http.workers", "mip.workers")
    assert config.server.cpus == 16


def test_a_word_other_than_auto_is_refused() -> None:
    with pytest.raises(ValueError, match=r"http\.workers: expected an integer"):
        from_dict({"http": {"workers": "many"}}, "x")
