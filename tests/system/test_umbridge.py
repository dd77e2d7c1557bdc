"""UM-Bridge through the stock client from PyPI (umbridge 1.2.10), plain and shmem."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import umbridge

from appliance.core.status import Counter
from tests.system.harness import Appliance, counted, demo_models, rendezvous, running

MODELS = "tests.umbridge_models"
EXTRA: list[dict[str, Any]] = [
    {"name": "scaled", "class": f"{MODELS}:Scaled"},
    {"name": "typed", "class": f"{MODELS}:Typed"},
    {"name": "faulty", "class": f"{MODELS}:Faulty"},
    {"name": "unmappable", "class": f"{MODELS}:Unmappable"},
    {
        "name": "probe",
        "class": "tests.models:BatchProbe",
        "max_queue_delay_ms": 1000.0,
        "options": {"delay_s": 0.05},
    },
]
LISTED = [
    "simple",
    "simple_int8",
    "forward",
    "rosenbrock",
    "digits",
    "simple_sequence",
    "simple_dyna_sequence",
    "simple_string_dyna_sequence",
    "scaled",
    "typed",
    "faulty",
    "probe",
]
SHMEM = [pytest.param(False, id="http"), pytest.param(True, id="shmem")]


@pytest.fixture(scope="module")
def served() -> Iterator[Appliance]:
    with running(demo_models() + EXTRA, http={"workers": 1, "threads": 8}) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def url(served: Appliance) -> str:
    return f"http://127.0.0.1:{served.ports['http']}"


def connect(url: str, name: str, use_shmem: bool) -> umbridge.HTTPModel:
    model = umbridge.HTTPModel(url, name, use_shmem=use_shmem)
    assert model.supports_shmem() is use_shmem
    return model


def test_info_lists_the_models_with_fixed_numeric_sizes(url: str) -> None:
    assert umbridge.supported_models(url) == LISTED
    reply = requests.get(f"{url}/Info", timeout=10).json()
    assert reply == {"protocolVersion": 1.0, "models": LISTED}


@pytest.mark.parametrize(
    ("name", "inputs", "outputs", "support"),
    [
        ("simple", [16, 16], [16, 16], (True, False, False, False)),
        ("forward", [1], [1], (True, True, False, False)),
        ("rosenbrock", [2], [1], (True, True, True, True)),
        ("digits", [64], [10], (True, False, False, False)),
        ("scaled", [2, 3], [2, 1], (True, True, True, True)),
        ("typed", [6, 2], [3, 1], (True, False, False, False)),
    ],
)
def test_sizes_and_support_flags(
    url: str, name: str, inputs: list[int], outputs: list[int], support: tuple[bool, ...]
) -> None:
    model = connect(url, name, False)
    assert model.get_input_sizes() == inputs
    assert model.get_output_sizes({}) == outputs
    flags = (
        model.supports_evaluate(),
        model.supports_gradient(),
        model.supports_apply_jacobian(),
        model.supports_apply_hessian(),
    )
    assert flags == support


@pytest.mark.parametrize("use_shmem", SHMEM)
def test_every_listed_demo_model_evaluates(url: str, use_shmem: bool) -> None:
    assert connect(url, "forward", use_shmem)([[3.0]]) == [[6.0]]
    assert connect(url, "rosenbrock", use_shmem)([[1.0, 2.0]]) == [[100.0]]
    a, b = list(range(16)), [1.0] * 16
    total, difference = connect(url, "simple", use_shmem)([a, b])
    assert total == [x + 1.0 for x in a]
    assert difference == [x - 1.0 for x in a]
    (probabilities,) = connect(url, "digits", use_shmem)([[0.0] * 32 + [8.0] * 32])
    assert len(probabilities) == 10
    assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("use_shmem", SHMEM)
def test_forward_gradient_is_twice_the_sensitivity(url: str, use_shmem: bool) -> None:
    assert connect(url, "forward", use_shmem).gradient(0, 0, [[3.0]], [5.0]) == [10.0]


def test_access_lines_name_the_model_of_evaluate_and_of_a_derivative(
    served: Appliance, url: str
) -> None:
    # Both wait in the event loop; the model name reaches the access line.
    model = connect(url, "forward", False)
    assert model([[2.0]]) == [[4.0]]
    assert model.gradient(0, 0, [[3.0]], [5.0]) == [10.0]
    time.sleep(0.2)  # the access lines are flushed as the requests end
    log = served.log()
    assert "umbridge model=forward status=200" in log
    lines = [line for line in log.splitlines() if "POST /Gradient" in line]
    assert lines
    assert "model=forward" in lines[-1], lines[-1]


def test_derivatives_in_flight_are_not_capped_by_the_http_threads(tmp_path: Path) -> None:
    # One pool thread, two gradients that each wait for the other at a model:
    # they pass only if both reach the models at once.
    with running([rendezvous(tmp_path)], http={"workers": 1, "threads": 1}) as appliance:
        url = f"http://127.0.0.1:{appliance.ports['http']}"

        def gradient(sens: float) -> Any:
            return connect(url, "rendezvous", False).gradient(0, 0, [[1.0]], [sens])

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            assert list(pool.map(gradient, [1.0, 2.0])) == [[1.0], [2.0]]


def rosenbrock(x: np.ndarray) -> float:
    return float((1.0 - x[0]) ** 2 + 100.0 * (x[1] - x[0] ** 2) ** 2)


def central(f: Callable[[np.ndarray], Any], x: np.ndarray, v: np.ndarray, h: float) -> Any:
    return (np.asarray(f(x + h * v)) - np.asarray(f(x - h * v))) / (2.0 * h)


POINTS = [np.array([0.3, -0.7]), np.array([-1.2, 1.0]), np.array([1.5, 2.5])]


@pytest.mark.parametrize("use_shmem", SHMEM)
@pytest.mark.parametrize("x", POINTS, ids=["p0", "p1", "p2"])
def test_rosenbrock_derivatives_match_central_differences(
    url: str, use_shmem: bool, x: np.ndarray
) -> None:
    model = connect(url, "rosenbrock", use_shmem)
    h, sens, v = 1e-5, 0.5, np.array([0.6, -0.8])
    value = model([x.tolist()])[0][0]
    assert value == pytest.approx(rosenbrock(x), rel=1e-12)
    gradient = np.array(model.gradient(0, 0, [x.tolist()], [sens]))
    expected = [sens * central(rosenbrock, x, e, h) for e in np.eye(2)]
    np.testing.assert_allclose(gradient, expected, rtol=1e-6, atol=1e-6)
    jv = model.apply_jacobian(0, 0, [x.tolist()], v.tolist())
    assert len(jv) == 1
    assert jv[0] == pytest.approx(central(rosenbrock, x, v, h), rel=1e-6, abs=1e-6)
    hv = np.array(model.apply_hessian(0, 0, 0, [x.tolist()], [sens], v.tolist()))

    def served_gradient(point: np.ndarray) -> list[float]:
        return list(model.gradient(0, 0, [point.tolist()], [sens]))

    np.testing.assert_allclose(hv, central(served_gradient, x, v, h), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("use_shmem", SHMEM)
def test_in_wrt_and_out_wrt_reach_the_declared_tensors(url: str, use_shmem: bool) -> None:
    model = connect(url, "scaled", use_shmem)
    point = [[1.0, 2.0], [3.0, 4.0, 5.0]]
    config = {"scale": 3.0}
    assert model(point, config) == [[3.0, 6.0], [12.0]]
    assert model.gradient(0, 0, point, [1.0, 2.0], config) == [3.0, 6.0]
    assert model.gradient(0, 1, point, [1.0, 2.0], config) == [0.0, 0.0, 0.0]
    assert model.gradient(1, 1, point, [2.0], config) == [2.0, 2.0, 2.0]
    assert model.gradient(1, 0, point, [2.0], config) == [0.0, 0.0]
    assert model.apply_jacobian(0, 0, point, [1.0, -1.0], config) == [3.0, -3.0]
    assert model.apply_jacobian(1, 1, point, [1.0, 2.0, 3.0], config) == [6.0]
    assert model.apply_jacobian(0, 1, point, [1.0, 2.0, 3.0], config) == [0.0, 0.0]
    assert model.apply_hessian(1, 1, 0, point, [1.0], [1.0, 1.0], config) == [0.0] * 3
    assert model.apply_hessian(0, 0, 1, point, [1.0, 1.0], [1.0, 1.0, 1.0]) == [0.0] * 2


@pytest.mark.parametrize("use_shmem", SHMEM)
def test_config_reaches_the_model_as_parameters(url: str, use_shmem: bool) -> None:
    model = connect(url, "scaled", use_shmem)
    point = [[1.0, 2.0], [0.0, 0.0, 0.0]]
    assert model(point)[0] == [1.0, 2.0]
    assert model(point, {"scale": -0.5})[0] == [-0.5, -1.0]


@pytest.mark.parametrize("use_shmem", SHMEM)
def test_non_float_dtypes_convert_exactly(url: str, use_shmem: bool) -> None:
    model = connect(url, "typed", use_shmem)
    assert model([[1.0, 2.0, 3.0, -4.0, 5.0, 6.0], [1.0, 1.0]]) == [[-3.0, 7.0, 9.0], [2.0]]
    with pytest.raises(Exception, match=r"InvalidInput: .*m is INT16: element 2 = 1\.5"):
        model([[1.0, 2.0, 1.5, 0.0, 0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(Exception, match=r"InvalidInput: .*flags is BOOL: element 1 = 2\.0"):
        model([[0.0] * 6, [0.0, 2.0]])
    with pytest.raises(Exception, match=r"InvalidInput: .*element 0 = 40000\.0"):
        model([[40000.0] + [0.0] * 5, [0.0, 0.0]])


@pytest.mark.parametrize("use_shmem", SHMEM)
def test_model_side_failures_are_invalid_output(url: str, use_shmem: bool) -> None:
    model = connect(url, "faulty", use_shmem)
    assert model([[1.0, 2.0]]) == [[1.0, 2.0]]
    with pytest.raises(Exception, match=r"InvalidOutput: .*shape \[1, 3\]"):
        model([[1.0, 2.0]], {"wrong": True})
    with pytest.raises(Exception, match=r"InvalidOutput: .*asked to raise"):
        model([[1.0, 2.0]], {"raise": True})
    with pytest.raises(Exception, match=r"InvalidOutput: .*Model declared 2 but returned 5"):
        model.gradient(0, 0, [[1.0, 2.0]], [1.0, 1.0])
    with pytest.raises(Exception, match=r"InvalidOutput: .*Jacobian is singular"):
        model.apply_jacobian(0, 0, [[1.0, 2.0]], [1.0, 1.0])


def test_models_that_do_not_map_are_refused_by_name(url: str) -> None:
    for name in ("identity", "simple_string", "simple_identity", "echo", "unmappable"):
        with pytest.raises(Exception, match=f"Model {name} not supported by server"):
            umbridge.HTTPModel(url, name)
        reply = requests.post(f"{url}/InputSizes", json={"name": name}, timeout=10)
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["type"] == "ModelNotFound"
        assert "not served over UM-Bridge" in error["message"]


@pytest.mark.parametrize("use_shmem", SHMEM)
def test_concurrent_clients_get_their_own_answers_from_shared_batches(
    served: Appliance, url: str, use_shmem: bool
) -> None:
    threads, rounds = 8, 3
    before = served.client().counters("probe")
    barrier = threading.Barrier(threads)
    answers: dict[int, list[Any]] = {}
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            model = connect(url, "probe", use_shmem)
            for round_ in range(rounds):
                point = [float(index), float(round_), -float(index), 0.5]
                barrier.wait(timeout=30)
                answers[index * rounds + round_] = [point, model([point])]
        except BaseException as ex:
            failures.append(ex)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not failures
    assert len(answers) == threads * rounds
    batch_sizes = []
    for point, (doubled, batch) in answers.values():
        assert doubled == [2.0 * x for x in point]
        batch_sizes.append(batch[0])
    # SPEC: DESIGN.md "Models" — UM-Bridge evaluations ride the core's batching.
    assert max(batch_sizes) > 1
    after = counted(served.client(), "probe", threads * rounds, before)
    assert after[Counter.SUCCESS] - before[Counter.SUCCESS] == threads * rounds
    assert after[Counter.BATCHES] - before[Counter.BATCHES] < threads * rounds
