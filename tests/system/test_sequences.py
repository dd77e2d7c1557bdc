"""Stateful sequences, driven by tritonclient as Triton's sequence example clients drive them.

Each test sends what the examples send (``sequence_id``, ``sequence_start``,
``sequence_end`` over gRPC, its stream, HTTP and the aio stream) and asserts
what they assert; then the examples themselves run, unmodified, against the
same appliance.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.system import triton_examples
from tests.system.harness import Appliance, demo_models, eventually, running

MODELS = [
    *demo_models(
        "simple",
        "simple_sequence",
        "simple_dyna_sequence",
        "simple_string_dyna_sequence",
        simple_sequence={"instances": 2},
    ),
    # The live-sequence limit and the idle timeout, each on its own model.
    {
        "name": "few_sequences",
        "class": "appliance.demos.sequence:SimpleSequence",
        "sequence_strategy": "oldest",
        "max_candidate_sequences": 2,
    },
    # One "direct" slot and room for one sequence to wait for it.
    {
        "name": "one_slot",
        "class": "appliance.demos.sequence:SimpleSequence",
        "max_batch_size": 1,
        "max_candidate_sequences": 1,
    },
    {
        "name": "brief_sequences",
        "class": "appliance.demos.sequence:SimpleStringDynaSequence",
        "max_sequence_idle_s": 0.5,
    },
]
VALUES = [11, 7, 5, 3, 2, 0, 1]
EXAMPLES = (
    "simple_grpc_sequence_sync_infer_client.py",
    "simple_grpc_sequence_stream_infer_client.py",
    "simple_http_sequence_sync_infer_client.py",
    "simple_grpc_aio_sequence_stream_infer_client.py",
)


@pytest.fixture(scope="module")
def appliance() -> Iterator[Appliance]:
    # Two processes per transport and two instances of simple_sequence: steps
    # that arrive through either process find their sequence's instance.
    with running(MODELS, http={"workers": 2}, grpc={"workers": 2}) as started:
        yield started


def expected(dyna: bool, ids: tuple[int, int, str], strings: list[int]) -> list[list[int]]:
    """What the examples assert, step by step, for their three sequences.

    ``strings`` are the string sequence's results so far: with ``dyna`` the
    examples expect each to add the step's input to the one before.
    """
    rows = []
    for i in range(len(VALUES) + 1):
        first = 1 if i == 0 else VALUES[i - 1]
        second = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            third = 20 if dyna else 21
        elif dyna:
            third = -VALUES[i - 1] + strings[i - 1]
        else:
            third = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:
            first, second, third = first + ids[0], second + ids[1], third + int(ids[2])
        rows.append([first, second, third])
    return rows


def names(dyna: bool) -> tuple[str, str]:
    if dyna:
        return "simple_dyna_sequence", "simple_string_dyna_sequence"
    return "simple_sequence", "simple_sequence"


def sequences(dyna: bool, offset: int) -> list[tuple[str, int | str, list[int]]]:
    """The examples' three sequences: (model, sequence id, inputs)."""
    int_model, string_model = names(dyna)
    string_id = str(1002 + offset) if dyna else str(uuid.uuid4())
    return [
        (int_model, 1000 + offset * 2, [0, *VALUES]),
        (int_model, 1001 + offset * 2, [100, *(-v for v in VALUES)]),
        (string_model, string_id, [20, *(-v for v in VALUES)]),
    ]


def value_input(module: Any, value: int) -> Any:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return tensor


def check(dyna: bool, plan: list[tuple[str, int | str, list[int]]], got: list[list[int]]) -> None:
    ids = (int(plan[0][1]), int(plan[1][1]), str(plan[2][1]))
    want = expected(dyna, ids, got[2])
    assert [list(step) for step in zip(*got, strict=True)] == want


@pytest.mark.parametrize("dyna", [False, True])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sync_sequences_answer_as_the_examples_assert(
    protocol: str,
    dyna: bool,
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    client: Any = grpc_client if protocol == "grpc" else http_client
    module: Any = grpcclient if protocol == "grpc" else httpclient
    plan = sequences(dyna, offset=10 if protocol == "grpc" else 20)
    got: list[list[int]] = []
    for model, sequence_id, values in plan:
        results = []
        for count, value in enumerate(values, 1):
            result = client.infer(
                model,
                [value_input(module, value)],
                outputs=[module.InferRequestedOutput("OUTPUT")],
                sequence_id=sequence_id,
                sequence_start=count == 1,
                sequence_end=count == len(values),
            )
            results.append(int(result.as_numpy("OUTPUT")[0][0]))
        got.append(results)
    check(dyna, plan, got)


@pytest.mark.parametrize("dyna", [False, True])
def test_stream_sequences_answer_as_the_examples_assert(
    dyna: bool, grpc_client: grpcclient.InferenceServerClient
) -> None:
    plan = sequences(dyna, offset=30)
    answers: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for model, sequence_id, values in plan:
            for count, value in enumerate(values, 1):
                grpc_client.async_stream_infer(
                    model,
                    [value_input(grpcclient, value)],
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{sequence_id}_{count}",
                    sequence_id=sequence_id,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
        by_id: dict[str, list[int]] = {str(sequence_id): [] for _m, sequence_id, _v in plan}
        for _ in range(sum(len(values) for _m, _s, values in plan)):
            answer = answers.get(timeout=30)
            assert not isinstance(answer, InferenceServerException), answer
            this_id = answer.get_response().id.rsplit("_", 1)[0]
            by_id[this_id].append(int(answer.as_numpy("OUTPUT")[0][0]))
    finally:
        grpc_client.stop_stream()
    check(dyna, plan, [by_id[str(sequence_id)] for _m, sequence_id, _v in plan])


@pytest.mark.parametrize("dyna", [False, True])
def test_aio_stream_sequences_answer_as_the_examples_assert(
    dyna: bool, appliance: Appliance
) -> None:
    plan = sequences(dyna, offset=40)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for model, sequence_id, values in plan:
            for count, value in enumerate(values, 1):
                yield {
                    "model_name": model,
                    "inputs": [value_input(aiogrpcclient, value)],
                    "outputs": [aiogrpcclient.InferRequestedOutput("OUTPUT")],
                    "request_id": f"{sequence_id}_{count}",
                    "sequence_id": sequence_id,
                    "sequence_start": count == 1,
                    "sequence_end": count == len(values),
                }

    async def run() -> dict[str, list[int]]:
        by_id: dict[str, list[int]] = {str(sequence_id): [] for _m, sequence_id, _v in plan}
        url = f"127.0.0.1:{appliance.ports['grpc']}"
        async with aiogrpcclient.InferenceServerClient(url) as triton:
            async for result, error in triton.stream_infer(inputs_iterator=requests()):
                assert error is None, error
                this_id = result.get_response().id.rsplit("_", 1)[0]
                by_id[this_id].append(int(result.as_numpy("OUTPUT")[0][0]))
        return by_id

    by_id = asyncio.run(run())
    check(dyna, plan, [by_id[str(sequence_id)] for _m, sequence_id, _v in plan])


def test_interleaved_sequences_keep_their_own_state(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """Steps of many sequences, sent at once, share batches yet each sum stays its own."""
    model = "simple_string_dyna_sequence"
    ids = [str(5000 + n) for n in range(6)]
    inputs = [value_input(grpcclient, 1)]
    for sequence_id in ids:
        grpc_client.infer(model, inputs, sequence_id=sequence_id, sequence_start=True)
    answers: queue.Queue[Any] = queue.Queue()
    for step in range(5):
        for n, sequence_id in enumerate(ids):
            grpc_client.async_infer(
                model,
                [value_input(grpcclient, n)],
                partial(lambda key, result, error: answers.put((key, error or result)), step),
                sequence_id=sequence_id,
            )
        for _ in ids:
            _step, answer = answers.get(timeout=30)
            assert not isinstance(answer, InferenceServerException), answer
    for n, sequence_id in enumerate(ids):
        last = grpc_client.infer(
            model, [value_input(grpcclient, 0)], sequence_id=sequence_id, sequence_end=True
        )
        assert int(last.as_numpy("OUTPUT")[0][0]) == 1 + 5 * n + int(sequence_id)


def test_steps_through_any_frontend_process_reach_their_sequence(appliance: Appliance) -> None:
    """Each step on a new connection (either HTTP process) finds its sequence's instance."""
    url = f"http://127.0.0.1:{appliance.ports['http']}/v2/models/simple_sequence/infer"

    def infer(sequence_id: int, value: int, **flags: bool) -> int:
        body = {
            "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
            "parameters": {"sequence_id": sequence_id, **flags},
        }
        with requests.Session() as session:  # a new connection each time
            reply = session.post(url, json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        return int(reply.json()["outputs"][0]["data"][0])

    ids = range(7000, 7016)
    for sequence_id in ids:
        assert infer(sequence_id, 5, sequence_start=True) == 6
    for sequence_id in ids:
        assert infer(sequence_id, 5) == 5
    for sequence_id in ids:
        assert infer(sequence_id, 5, sequence_end=True) == 5


def test_umbridge_and_grps_carry_a_sequence_in_their_parameters(appliance: Appliance) -> None:
    """UM-Bridge's config and GRPS's query parameters reach the same mechanism."""
    base = f"http://127.0.0.1:{appliance.ports['http']}"
    model = "simple_string_dyna_sequence"

    def umbridge(value: int, **config: Any) -> float:
        body = {"name": model, "input": [[float(value)]], "config": config}
        reply = requests.post(f"{base}/Evaluate", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        return float(reply.json()["output"][0][0])

    def grps(value: int, query: str) -> int:
        tensor = {"name": "INPUT", "dtype": "DT_INT32", "shape": [1, 1], "flat_int32": [value]}
        reply = requests.post(
            f"{base}/grps/v1/infer/predict?model={model}&{query}",
            json={"gtensors": {"tensors": [tensor]}},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        return int(reply.json()["gtensors"]["tensors"][0]["flat_int32"][0])

    assert umbridge(3, sequence_id=6001, sequence_start=True) == 3.0
    assert grps(4, "sequence_id=6002&sequence_start=true") == 4
    assert umbridge(5, sequence_id=6001) == 8.0
    assert grps(6, "sequence_id=6002") == 10
    assert umbridge(1, sequence_id=6001, sequence_end=True) == 9.0 + 6001
    assert grps(1, "sequence_id=6002&sequence_end=true") == 11 + 6002


def test_model_config_describes_sequence_batching_as_triton_does(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    rest = http_client.get_model_config("simple_string_dyna_sequence")["sequence_batching"]
    grpc = grpc_client.get_model_config("simple_string_dyna_sequence", as_json=True)["config"][
        "sequence_batching"
    ]
    for described in (rest, grpc):
        assert int(described["max_sequence_idle_microseconds"]) == 60_000_000
        assert "direct" in described
        controls = {item["name"]: item["control"][0] for item in described["control_input"]}
        # Protobuf's JSON leaves out an enum at its zero value, CONTROL_SEQUENCE_START.
        start = {"kind": "CONTROL_SEQUENCE_START", **controls["START"]}
        assert start == {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}
        assert controls["CORRID"]["kind"] == "CONTROL_SEQUENCE_CORRID"
        assert controls["READY"]["kind"] == "CONTROL_SEQUENCE_READY"
        [state] = described["state"]
        assert (state["input_name"], state["output_name"]) == ("SUM_IN", "SUM_OUT")
        assert [int(dim) for dim in state["dims"]] == [1]
    oldest = http_client.get_model_config("few_sequences")["sequence_batching"]
    assert oldest["oldest"]["max_candidate_sequences"] == 2
    assert "dynamic_batching" not in http_client.get_model_config("few_sequences")
    assert "sequence_batching" not in http_client.get_model_config("simple")


# -- errors ---------------------------------------------------------------------


def grpc_error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_a_step_of_an_unknown_sequence_is_refused_over_grpc_and_http(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    error = grpc_error(
        lambda: grpc_client.infer(
            "simple_sequence", [value_input(grpcclient, 1)], sequence_id=77777
        )
    )
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "no live sequence 77777" in error.message()
    assert "sequence_start" in error.message()
    error = grpc_error(
        lambda: http_client.infer(
            "simple_sequence", [value_input(httpclient, 1)], sequence_id="nobody"
        )
    )
    assert error.status() == "400"
    assert "no live sequence 'nobody'" in error.message()


def test_a_step_of_an_unknown_sequence_is_refused_in_a_stream_which_goes_on(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        inputs = [value_input(grpcclient, 4)]
        grpc_client.async_stream_infer("simple_sequence", inputs, sequence_id=66666)
        grpc_client.async_stream_infer(
            "simple_sequence", inputs, sequence_id=66666, sequence_start=True, sequence_end=True
        )
        refused, answered = answers.get(timeout=30), answers.get(timeout=30)
    finally:
        grpc_client.stop_stream()
    assert isinstance(refused, InferenceServerException)
    assert "no live sequence 66666" in refused.message()
    assert int(answered.as_numpy("OUTPUT")[0][0]) == 5


def test_a_second_start_of_a_live_sequence_is_refused(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    inputs = [value_input(grpcclient, 1)]
    grpc_client.infer("simple_sequence", inputs, sequence_id=88888, sequence_start=True)
    error = grpc_error(
        lambda: grpc_client.infer("simple_sequence", inputs, sequence_id=88888, sequence_start=True)
    )
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "sequence 88888 is already live" in error.message()
    # The live sequence is untouched: it still ends normally.
    grpc_client.infer("simple_sequence", inputs, sequence_id=88888, sequence_end=True)


def test_a_sequence_model_needs_a_sequence_id(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    error = grpc_error(lambda: grpc_client.infer("simple_sequence", [value_input(grpcclient, 1)]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "needs a sequence_id" in error.message()


def test_sequence_parameters_to_a_model_without_sequences_are_refused(
    grpc_client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
) -> None:
    for module, client in ((grpcclient, grpc_client), (httpclient, http_client)):
        inputs = [module.InferInput(f"INPUT{n}", [1, 16], "INT32") for n in range(2)]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        error = grpc_error(
            lambda c=client, i=inputs: c.infer("simple", i, sequence_id=5, sequence_start=True)
        )
        assert error.status() in ("StatusCode.INVALID_ARGUMENT", "400")
        assert "model simple does not serve stateful sequences" in error.message()


def test_too_many_live_sequences_are_refused(appliance: Appliance) -> None:
    url = f"127.0.0.1:{appliance.ports['http']}"
    with httpclient.InferenceServerClient(url) as client:
        inputs = [value_input(httpclient, 1)]
        for sequence_id in (1, 2):
            client.infer("few_sequences", inputs, sequence_id=sequence_id, sequence_start=True)
        error = grpc_error(
            lambda: client.infer("few_sequences", inputs, sequence_id=3, sequence_start=True)
        )
        assert error.status() == "429"
        assert "too many live sequences" in error.message()
        assert "max_candidate_sequences) is 2" in error.message()
        # Ending one makes room.
        client.infer("few_sequences", inputs, sequence_id=1, sequence_end=True)
        client.infer("few_sequences", inputs, sequence_id=3, sequence_start=True)


def test_a_direct_sequence_past_the_slots_waits_for_one(appliance: Appliance) -> None:
    url = f"127.0.0.1:{appliance.ports['grpc']}"
    inputs = [value_input(grpcclient, 1)]
    answers: queue.Queue[Any] = queue.Queue()

    def start_second() -> None:
        with grpcclient.InferenceServerClient(url) as second:
            result = second.infer("one_slot", inputs, sequence_id=502, sequence_start=True)
            answers.put(result.as_numpy("OUTPUT"))

    with grpcclient.InferenceServerClient(url) as client:
        client.infer("one_slot", inputs, sequence_id=501, sequence_start=True)
        waiter = threading.Thread(target=start_second)
        waiter.start()
        # The second start waits for the one slot, as Triton's direct strategy queues it.
        time.sleep(0.5)
        assert answers.empty()
        error = grpc_error(
            lambda: client.infer("one_slot", inputs, sequence_id=503, sequence_start=True)
        )
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "already wait" in error.message()
        assert "max_candidate_sequences" in error.message()
        # Ending the first frees the slot: the second starts.
        client.infer("one_slot", inputs, sequence_id=501, sequence_end=True)
        waiter.join(timeout=30)
        assert answers.get(timeout=1).tolist() == [[2]]
        client.infer("one_slot", inputs, sequence_id=502, sequence_end=True)


def test_an_idle_sequence_is_dropped(grpc_client: grpcclient.InferenceServerClient) -> None:
    inputs = [value_input(grpcclient, 1)]
    grpc_client.infer("brief_sequences", inputs, sequence_id=4242, sequence_start=True)
    grpc_client.infer("brief_sequences", inputs, sequence_id=4242)
    # Past max_sequence_idle_s (0.5 s) and the worker's once-a-second sweep.
    time.sleep(3.0)
    error = grpc_error(lambda: grpc_client.infer("brief_sequences", inputs, sequence_id=4242))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "no live sequence 4242" in error.message()
    assert "max_sequence_idle_s" in error.message()


def pid_or_zero(appliance: Appliance, role: str) -> int:
    try:
        return appliance.pid_of(role)
    except LookupError:  # between its death and its restart
        return 0


def test_a_step_after_its_instance_died_names_the_lost_sequence(appliance: Appliance) -> None:
    url = f"127.0.0.1:{appliance.ports['grpc']}"
    with grpcclient.InferenceServerClient(url) as client:
        inputs = [value_input(grpcclient, 1)]
        client.infer("simple_dyna_sequence", inputs, sequence_id=31337, sequence_start=True)
        victim = appliance.pid_of("model[simple_dyna_sequence#0]")
        os.kill(victim, signal.SIGKILL)
        assert eventually(
            lambda: (
                pid_or_zero(appliance, "model[simple_dyna_sequence#0]") not in (0, victim)
                and client.is_model_ready("simple_dyna_sequence")
            ),
            timeout_s=60,
        )
        error = grpc_error(lambda: client.infer("simple_dyna_sequence", inputs, sequence_id=31337))
        assert error.status() == "StatusCode.UNAVAILABLE"
        assert "sequence 31337 of model simple_dyna_sequence" in error.message()
        assert "start it again" in error.message()
        # Starting it again works on the new instance.
        client.infer("simple_dyna_sequence", inputs, sequence_id=31337, sequence_start=True)
        client.infer("simple_dyna_sequence", inputs, sequence_id=31337, sequence_end=True)


def test_a_step_in_flight_when_its_instance_dies_names_the_lost_sequence(
    tmp_path: Path,
) -> None:
    gated = {
        "name": "gated",
        "class": "tests.models:GatedSequence",
        "options": {"gate": str(tmp_path)},
    }
    with running([gated]) as appliance:
        url = f"127.0.0.1:{appliance.ports['grpc']}"
        with grpcclient.InferenceServerClient(url) as client:
            inputs = [value_input(grpcclient, 1)]
            client.infer("gated", inputs, sequence_id=777, sequence_start=True)
            (tmp_path / "hold").touch()
            errors: queue.Queue[InferenceServerException] = queue.Queue()
            step = threading.Thread(
                target=lambda: errors.put(
                    grpc_error(lambda: client.infer("gated", inputs, sequence_id=777))
                )
            )
            step.start()
            assert eventually((tmp_path / "running").exists, timeout_s=30)
            os.kill(appliance.pid_of("model[gated#0]"), signal.SIGKILL)
            step.join(timeout=30)
            error = errors.get(timeout=1)
        assert error.status() == "StatusCode.UNAVAILABLE"
        assert "sequence 777 of model gated" in error.message()
        assert "start it again with sequence_start=true" in error.message()


# -- Triton's own example clients ---------------------------------------------------


@triton_examples.needs_examples
@pytest.mark.parametrize("dyna", [False, True])
@pytest.mark.parametrize("example", EXAMPLES)
def test_triton_example_client_passes_unmodified(
    example: str, dyna: bool, appliance: Appliance, tmp_path: Path
) -> None:
    port = appliance.ports["http" if "http" in example else "grpc"]
    # Distinct offsets: sequences of one run must not meet those of another.
    offset = 100 + 10 * EXAMPLES.index(example) + (5 if dyna else 0)
    args = ["-o", str(offset), *(["-d"] if dyna else [])]
    done = triton_examples.run(example, f"127.0.0.1:{port}", tmp_path, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
