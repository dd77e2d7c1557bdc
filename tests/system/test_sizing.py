"""workers = "auto" sizes every transport to the CPUs the appliance may use."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from appliance.client.status_format import format_status
from tests.system.harness import demo_models, running

AUTO = {"workers": "auto"}


def roles(status: dict[str, Any]) -> Counter[str]:
    return Counter(str(process["role"]).split("[")[0] for process in status["processes"])


@pytest.mark.parametrize("cpus", [{0}, {0, 1}])
def test_auto_on_a_small_host_runs_one_http_worker_and_two_grpc_and_mip_processes(
    cpus: set[int],
) -> None:
    models = demo_models("echo", echo={"instances": "auto"})
    with running(models, affinity=cpus, http=AUTO, grpc=AUTO, mip=AUTO) as appliance:
        status = appliance.ctl("status")
        sizing = status["sizing"]
        assert sizing["cpus"] == len(cpus)
        assert sizing["counts"] == {
            "http.workers": 1,
            "grpc.workers": 2,
            "mip.workers": 2,
            "models.echo.instances": 1,
        }
        assert set(sizing["auto"]) == {
            "http.workers",
            "grpc.workers",
            "mip.workers",
            "models.echo.instances",
        }
        running_roles = roles(status)
        assert running_roles["http worker"] == 1
        assert running_roles["grpc"] == 2
        assert running_roles["mip"] == 2
        assert f"sized for {len(cpus)} CPUs: http.workers 1 (auto)" in format_status(status)


def test_server_cpus_and_numbers_override_what_is_found() -> None:
    with running(
        demo_models("echo"), server={"cpus": 8}, http=AUTO, grpc={"workers": 1}, mip=AUTO
    ) as appliance:
        sizing = appliance.ctl("status")["sizing"]
        assert sizing["cpus"] == 8
        assert sizing["counts"]["http.workers"] == 4
        assert sizing["counts"]["grpc.workers"] == 1
        assert "grpc.workers" not in sizing["auto"]
