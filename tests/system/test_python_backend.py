"""Triton Python-backend models (config.pbtxt + model.py) served as they are.

A copy of tests/data/python_models, a Triton repository of Python-backend
models written as Triton's users write them (``import triton_python_backend_utils
as pb_utils``, ``TritonPythonModel`` with initialize, execute, finalize and
auto_complete_config), is the appliance's only repository; tritonclient
drives it over REST and gRPC.
"""

from __future__ import annotations

import json
import queue
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.batch_probe import REQUESTS, batch_answers
from tests.sequence_streams import sequence_streamed
from tests.system.harness import (
    ROOT,
    Appliance,
    copied_repository,
    demo_models,
    make_config,
    new_run_dir,
    serving,
    serving_repository,
)

MODELS = ROOT / "tests" / "data" / "python_models"


@pytest.fixture(scope="module")
def repository() -> Iterator[Path]:
    with copied_repository(MODELS, "pyrepo-") as root:
        yield root


@pytest.fixture(scope="module")
def appliance(repository: Path) -> Iterator[Appliance]:
    with serving_repository(repository) as started:
        yield started


def clients(app: Appliance) -> list[tuple[Any, Any]]:
    return [
        (httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{app.ports['http']}")),
        (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{app.ports['grpc']}")),
    ]


def tensor(module: Any, name: str, array: np.ndarray, dtype: str) -> Any:
    item = module.InferInput(name, list(array.shape), dtype)
    item.set_data_from_numpy(array)
    return item


def test_add_sub_answers_over_rest_and_grpc(appliance: Appliance) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    for module, client in clients(appliance):
        try:
            inputs = [tensor(module, "INPUT0", a, "FP32"), tensor(module, "INPUT1", b, "FP32")]
            result = client.infer("add_sub", inputs)
            assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
            assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
            metadata = client.get_model_metadata("add_sub")
            platform = metadata["platform"] if module is httpclient else metadata.platform
            assert platform == "python"
        finally:
            client.close()


def test_execute_gets_a_batch_as_a_list_of_requests_with_inputs_in_shared_memory(
    appliance: Appliance,
) -> None:
    answers = batch_answers(f"127.0.0.1:{appliance.ports['http']}")
    # Requests that queued behind a running execute came in one list.
    assert max(count for count, _writable, _tag in answers) > 1, answers
    # Inputs are read-only views of shared memory, never a model's to change.
    assert not any(writable for _count, writable, _tag in answers)
    # Each request kept its own parameters.
    assert [tag for _c, _w, tag in answers] == [f"t{i}" for i in range(REQUESTS)]


def test_auto_complete_config_declares_the_tensors_a_config_leaves_out(
    appliance: Appliance,
) -> None:
    for module, client in clients(appliance):
        try:
            x = np.array([[1.0, 2.0]], dtype=np.float64)
            result = client.infer("auto_declared", [tensor(module, "IN", x, "FP64")])
            assert np.array_equal(result.as_numpy("DOUBLED"), 2 * x)
            if module is httpclient:
                config = client.get_model_config("auto_declared")
                assert config["max_batch_size"] == 4
                assert [i["name"] for i in config["input"]] == ["IN"]
        finally:
            client.close()


def step(module: Any, client: Any, model: str, value: int, sequence: int | str, flag: str) -> Any:
    shape = [1, 1] if model == "accumulate" else [1]
    x = tensor(module, "VALUE", np.array([value], np.int32).reshape(shape), "INT32")
    start, end = flag in ("start", "both"), flag in ("end", "both")
    return client.infer(model, [x], sequence_id=sequence, sequence_start=start, sequence_end=end)


def test_a_sequence_model_sees_its_controls_correlation_id_and_flags(appliance: Appliance) -> None:
    for module, client in clients(appliance):
        try:
            steps = [(41, 3, "start"), (42, 4, "start"), (41, 5, ""), (42, 6, "end")]
            steps += [(41, 7, "end"), (43, 2, "both")]
            answers = [step(module, client, "accumulate", v, sid, flag) for sid, v, flag in steps]
            # Each sequence's own running sum, kept by the model by correlation_id().
            assert [int(a.as_numpy("SUM")[0, 0]) for a in answers] == [3, 4, 8, 10, 15, 2]
            # START, END, READY, CORRID, correlation_id(), flags() as execute saw them.
            seen = [a.as_numpy("SEEN")[0].tolist() for a in answers]
            assert seen == [
                [1, 0, 1, 41, 41, 1],
                [1, 0, 1, 42, 42, 1],
                [0, 0, 1, 41, 41, 0],
                [0, 1, 1, 42, 42, 2],
                [0, 1, 1, 41, 41, 2],
                [1, 1, 1, 43, 43, 3],
            ]
            # CORRID is UINT64: a string id cannot fill it, and the answer says so.
            with pytest.raises(InferenceServerException, match="CORRID is UINT64"):
                step(module, client, "accumulate", 1, "a-string-id", "start")
            with pytest.raises(InferenceServerException, match="no live sequence 41"):
                step(module, client, "accumulate", 1, 41, "")
        finally:
            client.close()


def test_a_decoupled_sequence_model_streams_each_step(appliance: Appliance) -> None:
    url = f"127.0.0.1:{appliance.ports['grpc']}"
    steps = [(91, 3, "start"), (91, 4, ""), (91, 5, "end"), (92, 7, "both"), (91, 1, "")]
    answers = sequence_streamed(url, steps)
    # Each step: its running sum, then START, END, CORRID, correlation_id(), flags().
    assert answers[:4] == [
        [("SUM", [3]), ("SEEN", [1, 0, 91, 91, 1])],
        [("SUM", [7]), ("SEEN", [0, 0, 91, 91, 0])],
        [("SUM", [12]), ("SEEN", [0, 1, 91, 91, 2])],
        [("SUM", [7]), ("SEEN", [1, 1, 92, 92, 3])],
    ]
    # Sequence 91 ended: a step of it is refused, on the stream, with the reason.
    [(kind, message)] = answers[4]
    assert kind == "error"
    assert "no live sequence 91" in message


def test_a_stream_the_worker_refuses_gets_its_error_at_once(appliance: Appliance) -> None:
    # square_stream is no sequence model: the worker refuses sequence parameters.
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        x = tensor(grpcclient, "IN", np.array([2], dtype=np.int32), "INT32")
        client.async_stream_infer("square_stream", [x], sequence_id=5, sequence_start=True)
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert result is None
    assert "does not serve stateful sequences" in error.message()


def test_a_python_sequence_model_s_implicit_state_is_carried_between_steps(
    appliance: Appliance,
) -> None:
    for module, client in clients(appliance):
        try:
            for sequence in (51, "text-id"):
                totals = [
                    int(
                        step(module, client, "running_total", value, sequence, flag).as_numpy(
                            "TOTAL"
                        )[0]
                    )
                    for value, flag in ((3, "start"), (4, ""), (5, "end"))
                ]
                assert totals == [3, 7, 12]
        finally:
            client.close()


@pytest.mark.parametrize(
    ("do", "status", "words"),
    [
        ("raise", "", "execute raised ValueError: asked to raise"),
        ("count", "", "execute returned 0 responses for 1 requests"),
        ("object", "", "execute returned dict where an InferenceResponse was due"),
        ("error", "400", "X must be positive"),
        ("write", "", "read-only views of the request's shared memory: copy one"),
    ],
)
def test_a_misbehaving_execute_fails_its_requests_not_the_instance(
    appliance: Appliance, do: str, status: str, words: str
) -> None:
    x = np.array([1.0, 2.0], dtype=np.float32)  # max_batch_size 0: no rows dimension
    for module, client in clients(appliance):
        try:
            with pytest.raises(InferenceServerException) as failed:
                client.infer("misbehaving", [tensor(module, "X", x, "FP32")], parameters={"do": do})
            assert words in str(failed.value)
            assert "misbehaving" in str(failed.value) or do == "error"
            if status and module is httpclient:
                assert failed.value.status() == status
            # The same instance answers the next request.
            result = client.infer("misbehaving", [tensor(module, "X", x, "FP32")])
            assert np.array_equal(result.as_numpy("Y"), x)
        finally:
            client.close()
    row = next(p for p in appliance.processes() if p["model"] == "misbehaving")
    assert row["restarts"] == 0


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("import_fails", "ModuleNotFoundError: No module named 'a_module_nobody_installed'"),
        ("initialize_fails", "initialize raised RuntimeError: weights.bin is missing"),
    ],
)
def test_a_model_py_that_cannot_load_is_reported_with_its_reason(
    appliance: Appliance, model: str, words: str
) -> None:
    ready, entry = appliance.kserve_state(model)
    assert not ready
    assert entry["state"] == "UNAVAILABLE"
    assert words in entry["reason"], entry
    assert "add_sub" in [p["model"] for p in appliance.processes() if p["state"] == "ready"]


def test_finalize_runs_when_the_model_is_unloaded_with_triton_s_args(
    appliance: Appliance, repository: Path
) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        rest.unload_model("add_sub")
        deadline = time.monotonic() + 30
        while not list((repository / "add_sub").glob("finalized-*")):
            assert time.monotonic() < deadline, "finalize did not run"
            time.sleep(0.1)
        [marker] = (repository / "add_sub").glob("finalized-*")
        args = json.loads(marker.read_text())
        assert args["model_name"] == "add_sub"
        assert args["model_version"] == "1"
        assert args["model_instance_kind"] == "CPU"
        assert Path(args["model_repository"]) == repository / "add_sub"
        rest.load_model("add_sub")
        assert rest.is_model_ready("add_sub")
    finally:
        rest.close()


TOML_CONFIG = """
platform = "python"
max_batch_size = 8
inputs = [
  { name = "INPUT0", dtype = "FP32", shape = [-1, 4] },
  { name = "INPUT1", dtype = "FP32", shape = [-1, 4] },
]
outputs = [
  { name = "OUTPUT0", dtype = "FP32", shape = [-1, 4] },
  { name = "OUTPUT1", dtype = "INT32", shape = [-1, 4] },
]
"""


SAYS_MORE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            said = {"content_type": "np", "rows": 1} if x.as_numpy()[0] > 0 else "[not an object]"
            y = pb_utils.Tensor("Y", x.as_numpy())
            answers.append(pb_utils.InferenceResponse([y], parameters=said))
        return answers
"""
SAYS_MORE_CONFIG = """
backend: "python"
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""


def test_a_model_described_by_config_toml_gets_triton_s_model_config(tmp_path: Path) -> None:
    (tmp_path / "add_sub" / "1").mkdir(parents=True)
    shutil.copy(MODELS / "add_sub" / "1" / "model.py", tmp_path / "add_sub" / "1")
    (tmp_path / "add_sub" / "config.toml").write_text(TOML_CONFIG)
    # And one whose responses carry parameters (newer Triton's InferenceResponse).
    (tmp_path / "says_more" / "1").mkdir(parents=True)
    (tmp_path / "says_more" / "1" / "model.py").write_text(SAYS_MORE)
    (tmp_path / "says_more" / "config.pbtxt").write_text(SAYS_MORE_CONFIG)
    with serving_repository(tmp_path) as started:
        rest = httpclient.InferenceServerClient(f"127.0.0.1:{started.ports['http']}")
        try:
            result = rest.infer(
                "says_more", [tensor(httpclient, "X", np.ones(1, np.float32), "FP32")]
            )
            assert result.get_response()["parameters"] == {"content_type": "np", "rows": 1}
            with pytest.raises(InferenceServerException, match="must be a dict or a JSON object"):
                rest.infer("says_more", [tensor(httpclient, "X", np.zeros(1, np.float32), "FP32")])
            a = np.ones((2, 4), dtype=np.float32)
            inputs = [
                tensor(httpclient, "INPUT0", a, "FP32"),
                tensor(httpclient, "INPUT1", a, "FP32"),
            ]
            result = rest.infer("add_sub", inputs)
            # initialize read the output types from args["model_config"].
            assert result.as_numpy("OUTPUT1").dtype == np.int32
            rest.unload_model("add_sub")
        finally:
            rest.close()
        deadline = time.monotonic() + 30
        while not list((tmp_path / "add_sub").glob("finalized-*")):
            assert time.monotonic() < deadline, "finalize did not run"
            time.sleep(0.1)
    [marker] = (tmp_path / "add_sub").glob("finalized-*")
    model_config = json.loads(json.loads(marker.read_text())["model_config"])
    assert model_config["max_batch_size"] == 8
    assert [(t["name"], t["dims"]) for t in model_config["input"]] == [
        ("INPUT0", [4]),
        ("INPUT1", [4]),
    ]
    assert model_config["output"][1]["data_type"] == "TYPE_INT32"


@pytest.mark.parametrize(
    ("call", "seen"),
    [
        ("add_sub", {"OUTPUT0": [[0.0, 2.0, 4.0, 6.0]]}),
        ("nope", {"error": "Request for unknown model: 'nope' is not found"}),
        ("misbehaving_error", {"error": "X must be positive"}),
        ("square", [{"IDX": [i], "OUT": [3]} for i in range(3)] + [{}]),
    ],
)
def test_execute_calls_other_models_and_gets_their_answers_or_errors(
    appliance: Appliance, call: str, seen: Any
) -> None:
    for module, client in clients(appliance):
        try:
            x = tensor(module, "X", np.arange(4, dtype=np.float32), "FP32")
            for name, expected in ((call, seen), (f"async_{call}", [seen, seen])):
                result = client.infer("bls_caller", [x], parameters={"call": name})
                assert json.loads(result.as_numpy("SEEN")[0]) == expected, name
        finally:
            client.close()


def test_execute_calls_a_sequence_model_step_by_step(appliance: Appliance) -> None:
    # bls_caller sends three steps of sequence 71 (correlation_id and flags set).
    for module, client in clients(appliance):
        try:
            x = tensor(module, "X", np.arange(4, dtype=np.float32), "FP32")
            result = client.infer("bls_caller", [x], parameters={"call": "sequence"})
            assert json.loads(result.as_numpy("SEEN")[0]) == [
                {"SUM": [[2]], "SEEN": [[1, 0, 1, 71, 71, 1]]},
                {"SUM": [[5]], "SEEN": [[0, 0, 1, 71, 71, 0]]},
                {"SUM": [[9]], "SEEN": [[0, 1, 1, 71, 71, 2]]},
            ]
        finally:
            client.close()


def test_execute_unloads_and_loads_a_model_by_triton_s_model_loading_api(
    appliance: Appliance,
) -> None:
    # bls_caller: is_model_ready, unload_model, load_model of auto_declared, a load of
    # a model no repository holds, then a call with preferred_memory and trace.
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        x = tensor(httpclient, "X", np.arange(4, dtype=np.float32), "FP32")
        result = rest.infer("bls_caller", [x], parameters={"call": "manage"})
        assert json.loads(result.as_numpy("SEEN")[0]) == [
            True,
            False,
            False,
            True,
            {"error": True},
            {"OUTPUT1": [[0.0, 0.0, 0.0, 0.0]]},
        ]
        assert rest.is_model_ready("auto_declared")
    finally:
        rest.close()


def test_a_model_s_own_metrics_are_on_metrics_by_their_own_names(appliance: Appliance) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['http']}")
    try:
        for x in (2.0, 5.0, 20.0):
            inputs = [tensor(httpclient, "X", np.array([x], dtype=np.float32), "FP32")]
            result = rest.infer("metrics_probe", inputs)
        assert result.as_numpy("VALUE")[0] == 27.0  # the counter's value, as the model reads it
    finally:
        rest.close()
    url = f"http://127.0.0.1:{appliance.ports['http']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    labels = '{kind="probe",model="metrics_probe"}'
    for line in (
        "# HELP probe_input_total_sum Sum of every input",
        "# TYPE probe_input_total_sum counter",
        f"probe_input_total_sum{labels} 27.0",
        "# TYPE probe_last_input gauge",
        f"probe_last_input{labels} 20.0",
        "# TYPE probe_inputs histogram",
        f"probe_inputs_count{labels} 3.0",
        f"probe_inputs_sum{labels} 27.0",
    ):
        assert line in text, line


def test_an_execute_past_the_request_s_deadline_fails_that_request_alone(
    appliance: Appliance,
) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    try:
        x = np.array([1.0, 2.0], dtype=np.float32)
        slow = {"do": "sleep", "seconds": 3}
        with pytest.raises(InferenceServerException) as late:
            client.infer(
                "misbehaving",
                [tensor(grpcclient, "X", x, "FP32")],
                parameters=slow,
                client_timeout=0.5,
            )
        assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        # Other models answer while it is busy.
        a = np.ones((1, 4), dtype=np.float32)
        inputs = [tensor(grpcclient, "INPUT0", a, "FP32"), tensor(grpcclient, "INPUT1", a, "FP32")]
        assert np.array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
        # And the slow one answers again once its execute returned.
        result = client.infer(
            "misbehaving", [tensor(grpcclient, "X", x, "FP32")], client_timeout=30
        )
        assert np.array_equal(result.as_numpy("Y"), x)
    finally:
        client.close()


def test_a_decoupled_model_s_error_is_followed_by_the_final_response_asked_for(
    appliance: Appliance,
) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{appliance.ports['grpc']}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for n in (-1, 1):
            x = tensor(grpcclient, "IN", np.array([n], dtype=np.int32), "INT32")
            client.async_stream_infer(
                "square_stream", [x], request_id=f"n{n}", enable_empty_final_response=True
            )
        got = [answers.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
        client.close()
    (_, error), (final, none), (part, _), (last, _) = got
    assert "IN must be >= 0" in error.message()
    assert none is None
    assert final.get_response().id == "n-1"
    assert final.get_response().parameters["triton_final_response"].bool_param
    assert part.as_numpy("OUT").tolist() == [1]
    # The decoupled model read the request's id (request.request_id()).
    assert part.as_numpy("ID").tolist() == [b"n1"]
    assert last.get_response().parameters["triton_final_response"].bool_param


BLS_RUNTIMES = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def call(model, tensor, output):
    request = pb_utils.InferenceRequest(
        model_name=model, inputs=[tensor], requested_output_names=[output]
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, output).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS").as_numpy()
            seen = {
                model: int(call(model, pb_utils.Tensor("pixels", pixels), "probabilities").argmax())
                for model in ("digits", "digits_onnx", "digits_torch")
            }
            image = pb_utils.Tensor("IMAGE", pixels.reshape(1, 8, 8).astype(np.uint8))
            label = call("digits_ensemble", image, "LABEL")[0][0]
            seen["digits_ensemble"] = label.decode() if isinstance(label, bytes) else str(label)
            text = np.array([json.dumps(seen).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", text)]))
        return responses
"""
BLS_RUNTIMES_CONFIG = """
backend: "python"
input [{ name: "PIXELS", data_type: TYPE_FP32, dims: [ 1, 64 ] }]
output [{ name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] }]
"""


def test_execute_calls_models_of_every_runtime_and_an_ensemble(tmp_path: Path) -> None:
    (tmp_path / "bls_runtimes" / "1").mkdir(parents=True)
    (tmp_path / "bls_runtimes" / "1" / "model.py").write_text(BLS_RUNTIMES)
    (tmp_path / "bls_runtimes" / "config.pbtxt").write_text(BLS_RUNTIMES_CONFIG)
    demos = ROOT / "appliance" / "demos"
    steps = "appliance.demos.digits_steps"
    models = [
        *demo_models("digits"),
        {"name": "digits_preprocess", "class": f"{steps}:DigitsPreprocess"},
        {"name": "digits_postprocess", "class": f"{steps}:DigitsPostprocess"},
    ]
    config = make_config(new_run_dir(), models)
    config["repositories"] = [
        {"path": str(tmp_path)},
        {"path": str(demos / "repository")},
        {"path": str(demos / "ensembles")},
    ]
    with np.load(ROOT / "tests" / "data" / "digits_holdout.npz") as data:
        pixels, label = data["X"][:1].astype(np.float32), int(data["y"][0])
    with serving(config) as started:
        rest = httpclient.InferenceServerClient(f"127.0.0.1:{started.ports['http']}")
        try:
            result = rest.infer("bls_runtimes", [tensor(httpclient, "PIXELS", pixels, "FP32")])
        finally:
            rest.close()
    seen = json.loads(result.as_numpy("SEEN")[0])
    assert seen == {
        "digits": label,
        "digits_onnx": label,
        "digits_torch": label,
        "digits_ensemble": str(label),
    }
