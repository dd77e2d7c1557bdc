"""Fixtures that run real appliances over loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from appliance.client.api import ModelClient
from tests.gpu import cuda_missing
from tests.system.harness import Appliance, demo_models, running


@pytest.fixture(scope="module")
def demo() -> Iterator[Appliance]:
    """An appliance serving every demo model, shared by a module's tests."""
    with running(demo_models(), http={"workers": 1}) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def client(demo: Appliance) -> ModelClient:
    return demo.client()


@pytest.fixture(scope="module")
def grpc_client(appliance: Appliance) -> Iterator[grpcclient.InferenceServerClient]:
    """tritonclient over gRPC to the module's own ``appliance`` fixture."""
    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def http_client(appliance: Appliance) -> Iterator[httpclient.InferenceServerClient]:
    """tritonclient over REST to the module's own ``appliance`` fixture."""
    triton = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    yield triton
    triton.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests, with the reason, where no CUDA device is usable."""
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if marked and cuda_missing():
        skip = pytest.mark.skip(reason=cuda_missing())
        for item in marked:
            item.add_marker(skip)
