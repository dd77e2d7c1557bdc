"""One MLServer model folder served by ``mlserver start`` and by the appliance, call by call.

The folder (tests/mlserver_models.py, written fresh into tmp: a
scikit-learn SVM with versions and predict_fn, a regressor, XGBoost and
LightGBM classifiers, a custom ``MLModel`` in models.py, and models that
fail to load) is served unchanged by MLServer 1.7.1 with its runtimes
(bench/.peers/mlserver-runtimes, pinned to this Python's scikit-learn,
XGBoost and LightGBM) and by the appliance. The same tritonclient calls
go to both over REST and gRPC: outputs must be equal, errors must have the
same status and the appliance's message must hold MLServer's.

Where the appliance answers otherwise on purpose, ``ON_PURPOSE`` says why
(docs/models/mlserver.md lists the same).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from bench.servers import PeerServer, PeerUnavailable, mlserver_folder
from tests.mlserver_models import write_folder
from tests.peers.oracle import at_once
from tests.system.harness import Appliance, serving_repository

pytestmark = [
    pytest.mark.peers,
    pytest.mark.skipif(
        importlib.util.find_spec("mlserver") is None,
        reason="the mlserver extra is not installed (pip install 'appliance[mlserver]')",
    ),
]

ROWS = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]], np.float32)
# What a call returns: ("ok", outputs) or ("error", status, message).
Answer = tuple[Any, ...]


def inputs(
    module: ModuleType, arrays: dict[str, np.ndarray], content_types: dict[str, str]
) -> list[Any]:
    made = []
    for name, array in arrays.items():
        dtype = "BYTES" if array.dtype == object else str(array.dtype).upper()
        dtype = {"FLOAT32": "FP32", "FLOAT64": "FP64"}.get(dtype, dtype)
        item = module.InferInput(name, list(array.shape), dtype)
        # MLServer's REST has no binary tensor extension: JSON data.
        if module is httpclient:
            item.set_data_from_numpy(array, binary_data=False)
        else:
            item.set_data_from_numpy(array)
        if name in content_types:  # tritonclient has no call for an input's parameters
            if module is httpclient:
                item._parameters["content_type"] = content_types[name]
            else:
                item._input.parameters["content_type"].string_param = content_types[name]
        made.append(item)
    return made


def infer(
    model: str,
    arrays: dict[str, np.ndarray],
    outputs: tuple[str, ...] = (),
    version: str = "",
    parameters: dict[str, Any] | None = None,
    content_types: dict[str, str] | None = None,
) -> Any:
    def call(module: ModuleType, client: Any) -> dict[str, Any]:
        wanted = None
        if outputs:
            extra = {"binary_data": False} if module is httpclient else {}
            wanted = [module.InferRequestedOutput(name, **extra) for name in outputs]
        result = client.infer(
            model,
            inputs(module, arrays, content_types or {}),
            model_version=version,
            outputs=wanted,
            parameters=parameters,
        )
        response = result.get_response(as_json=True) if module is grpcclient else None
        response = response or result.get_response()
        return plain_outputs(response, result)

    return call


def plain_outputs(response: dict[str, Any], result: Any) -> dict[str, Any]:
    """Each output's datatype, shape, elements (floats to 6 places) and parameters
    (the model's: its content_type; tritonclient's binary_data_size left out), and
    the response's own parameters (none and empty alike)."""
    plain: dict[str, Any] = {"(the response's parameters)": response.get("parameters") or {}}
    for output in response["outputs"]:
        array = result.as_numpy(output["name"])
        if array.dtype == object:
            array = np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b)(array)
        parameters = dict(output.get("parameters") or {})
        parameters.pop("binary_data_size", None)
        plain[output["name"]] = (
            output["datatype"],
            [int(d) for d in output["shape"]],
            np.round(array.astype(float), 6).tolist()
            if array.dtype.kind == "f"
            else array.tolist(),
            parameters,
        )
    return plain


def metadata(model: str, version: str = "") -> Any:
    def call(module: ModuleType, client: Any) -> dict[str, Any]:
        if module is grpcclient:
            found = client.get_model_metadata(model, version, as_json=True)
        else:
            found = client.get_model_metadata(model, version)
        return {key: found.get(key, default) for key, default in METADATA_KEYS.items()}

    return call


# Tensors with their parameters (MLServer's content types), over REST the model's own
# parameters too (tritonclient's gRPC proto has no place for them and drops them).
METADATA_KEYS: dict[str, Any] = {
    "name": "",
    "platform": "",
    "inputs": [],
    "outputs": [],
    "parameters": {},
}
TEXT = np.array(["hello", "world"], dtype=object)
BOOM = np.array(["boom"], dtype=object)
B64 = np.array([b"aGVsbG8=", b"d29ybGQ="], dtype=object)
WHEN = np.array([b"2021-08-24T15:01:19", b"2026-11-28T04:00:00"], dtype=object)
COLUMNS = {name: ROWS[:, i].copy() for i, name in enumerate("abcd")}

CALLS: dict[str, Any] = {
    "svm predict": infer("mnist-svm", {"predict": ROWS}),
    "svm predict_proba asked": infer("mnist-svm", {"predict": ROWS}, ("predict_proba",)),
    "svm both outputs": infer("mnist-svm", {"predict": ROWS}, ("predict", "predict_proba")),
    "svm predict_fn predict_proba": infer("svm-proba", {"x": ROWS}),
    "svm pandas columns": infer("mnist-svm", COLUMNS, parameters={"content_type": "pd"}),
    "svm FP64 rows": infer("mnist-svm", {"predict": ROWS.astype(np.float64)}),
    "svm content_type np": infer("mnist-svm", {"p": ROWS}, parameters={"content_type": "np"}),
    "svm unknown content_type": infer(
        "mnist-svm", {"p": ROWS}, parameters={"content_type": "nope"}
    ),
    "svm two inputs as np": infer("mnist-svm", COLUMNS, parameters={"content_type": "np"}),
    "custom content_type str": infer("custom", {"text": TEXT}, parameters={"content_type": "str"}),
    "custom input content_type base64": infer(
        "custom", {"show": B64}, content_types={"show": "base64"}
    ),
    "custom input content_type datetime": infer(
        "custom", {"show": WHEN}, content_types={"show": "datetime"}
    ),
    "custom input content_type str": infer("custom", {"show": TEXT}, content_types={"show": "str"}),
    "content_type from the settings' inputs": infer("custom-typed", {"show_when": WHEN}),
    "custom INT64": infer("custom", {"x": np.arange(4, dtype=np.int64).reshape(2, 2)}),
    "svm wrong width": infer("mnist-svm", {"predict": ROWS[:, :3].copy()}),
    "svm unknown output": infer("mnist-svm", {"predict": ROWS}, ("nope",)),
    "ridge": infer("ridge", {"predict": ROWS}),
    "ridge version v0.1.0": infer("ridge", {"predict": ROWS}, version="v0.1.0"),
    "svm no version 9": infer("mnist-svm", {"predict": ROWS}, version="9"),
    "metadata ridge v0.1.0": metadata("ridge", "v0.1.0"),
    "ridge predict_proba": infer("ridge", {"predict": ROWS}, ("predict_proba",)),
    "logreg newest": infer("logreg", {"predict": ROWS}, ("predict_proba",)),
    "logreg version 1": infer("logreg", {"predict": ROWS}, ("predict_proba",), version="1"),
    "xgboost": infer("mushroom-xgboost", {"x": ROWS}),
    "xgboost proba": infer("mushroom-xgboost", {"x": ROWS}, ("predict_proba",)),
    "lightgbm": infer("iris-lgb", {"x": ROWS}),
    "custom": infer("custom", {"text": TEXT, "x": np.array([1.5, 2.0], np.float32)}),
    "custom InferenceError": infer("custom", {"text": BOOM}),
    "custom raises": infer("custom", {"crash": np.ones(1, np.float32)}),
    "custom encodes a DataFrame": infer("custom", {"frame": np.array([1.5, 2.0], np.float32)}),
    "custom returns None": infer("custom", {"nothing": np.ones(1, np.float32)}),
    "unknown model": infer("nope", {"x": ROWS}),
    "metadata svm": metadata("mnist-svm"),
    "metadata custom": metadata("custom"),
    "metadata inputs with content types": metadata("custom-typed"),
    "metadata inputs, outputs and the model's content type": metadata("custom-declared"),
    "declared tensors are not checked": infer(
        "custom-declared", {"x": np.arange(3, dtype=np.float32)}
    ),
    "a streaming model's predict": infer("words", {"text": np.array(["hi there"], dtype=object)}),
}
# Errors the appliance's KServe protocol words (the same status, its own message).
WORDED_BY_THE_PROTOCOL = {"unknown model", "svm no version 9"}
# Answered otherwise on purpose (MLServer does not start with them at all).
ON_PURPOSE = {
    "fails to load": infer("fails-to-load", {"x": ROWS}),
    "missing artefact": infer("no-artefact", {"predict": ROWS}),
}


def answer(module: ModuleType, url: str, call: Any) -> Answer:
    client = module.InferenceServerClient(url)
    try:
        return ("ok", call(module, client))
    except InferenceServerException as ex:
        return ("error", str(ex.status()), str(ex.message()))
    finally:
        client.close()


FAILING = ("fails-to-load", "no-artefact")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder MLServer serves: without the models that fail to load, since
    ``mlserver start`` stops when one does (the appliance serves the rest)."""
    root = tmp_path_factory.mktemp("mlserver-folder")
    write_folder(root)
    for name in FAILING:
        shutil.rmtree(root / name)
    return root


@pytest.fixture(scope="module")
def appliance_folder(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same folder, with the models that fail to load."""
    root = tmp_path_factory.mktemp("appliance-folder")
    shutil.copytree(folder, root, dirs_exist_ok=True)
    with_failing = tmp_path_factory.mktemp("failing")
    write_folder(with_failing, only=("sklearn", "custom"))
    for name in FAILING:
        shutil.copytree(with_failing / name, root / name)
    return root


@pytest.fixture(scope="module")
def mlserver(folder: Path) -> Iterator[PeerServer]:
    try:
        with mlserver_folder(folder) as server:
            yield server
    except PeerUnavailable as ex:
        pytest.skip(f"MLServer is not available here: {ex}")


@pytest.fixture(scope="module")
def appliance(appliance_folder: Path) -> Iterator[Appliance]:
    with serving_repository(appliance_folder) as started:
        yield started


def url(server: PeerServer | Appliance, transport: str) -> str:
    if isinstance(server, Appliance):
        return f"127.0.0.1:{server.ports[transport]}"
    return server.urls[transport]


MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_every_call_answers_as_mlserver_answers(
    mlserver: PeerServer, appliance: Appliance, transport: str
) -> None:
    module = MODULES[transport]
    parted = []
    for name, call in CALLS.items():
        theirs = answer(module, url(mlserver, transport), call)
        ours = answer(module, url(appliance, transport), call)
        same = theirs[:2] == ours[:2]
        if same and theirs[0] == "error" and name not in WORDED_BY_THE_PROTOCOL:
            # The appliance names the model before MLServer's own message.
            same = theirs[2] in ours[2]
        if not same:
            parted.append(f"{name}:\n  mlserver:  {theirs}\n  appliance: {ours}")
    assert not parted, "\n".join(parted)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_model_that_fails_to_load_is_reported_and_the_rest_serve(
    appliance: Appliance, transport: str
) -> None:
    """MLServer stops at startup when a model fails to load; the appliance
    serves the others and answers for it not ready, with MLServer's reason."""
    module = MODULES[transport]
    reasons = {
        "fails to load": "weights are missing on purpose",
        "missing artefact": "Invalid URI specified for model no-artefact",
    }
    for name, call in ON_PURPOSE.items():
        kind, status, message = answer(module, url(appliance, transport), call)
        assert (kind, status) in (("error", "503"), ("error", "StatusCode.UNAVAILABLE")), name
        assert reasons[name] in message
    assert answer(module, url(appliance, transport), CALLS["svm predict"])[0] == "ok"


def batched_answers(http_url: str) -> list[tuple[list[float], int]]:
    """adaptive's answers to four requests sent at once: doubled, and how many rows the
    predict call that answered each was given."""
    answers: list[tuple[list[float], int]] = [([], 0)] * 4

    def one(n: int) -> None:
        client = httpclient.InferenceServerClient(http_url)
        x = httpclient.InferInput("x", [1, 2], "FP32")
        x.set_data_from_numpy(np.full((1, 2), n, np.float32), binary_data=False)
        result = client.infer("adaptive", [x])
        answers[n] = (result.as_numpy("doubled").tolist()[0], int(result.as_numpy("rows")[0][0]))
        client.close()

    at_once(one, 4)
    return answers


def test_adaptive_batching_merges_requests_into_one_predict_as_mlserver_does(
    mlserver: PeerServer, appliance: Appliance
) -> None:
    theirs = batched_answers(url(mlserver, "http"))
    ours = batched_answers(url(appliance, "http"))
    # Each request gets its own rows back, from a predict given more than its own.
    assert [doubled for doubled, _ in ours] == [doubled for doubled, _ in theirs]
    assert [doubled for doubled, _ in theirs] == [[0.0, 0.0], [2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]
    assert max(rows for _, rows in theirs) > 1
    assert max(rows for _, rows in ours) > 1


@pytest.fixture(scope="module")
def mlserver_streaming(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerServer]:
    """MLServer serving the streaming model with ``parallel_workers`` 0: its inference
    pool's model has no predict_stream, so MLServer calls a runtime's own only then
    (with workers it answers a stream with predict's one response)."""
    root = tmp_path_factory.mktemp("mlserver-streaming")
    for name in write_folder(root, only=("custom",)):
        if name != "words":
            shutil.rmtree(root / name)
    try:
        with mlserver_folder(root, parallel_workers=0) as server:
            yield server
    except PeerUnavailable as ex:
        pytest.skip(f"MLServer is not available here: {ex}")


def words_request(text: str) -> Any:
    """A ModelInferRequest to words, its input in raw_input_contents as tritonclient sends it."""
    request = pb.ModelInferRequest(model_name="words")
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    raw = serialize_byte_tensor(np.array([text.encode()], object))
    request.raw_input_contents.append(raw.item())
    return request


def plain_response(response: Any) -> Answer:
    """A ModelInferResponse's outputs: name, datatype, shape, parameters and raw bytes."""
    found = json_format.MessageToDict(response)
    outputs = [
        (o.get("name"), o.get("datatype"), o.get("shape"), o.get("parameters", {}))
        for o in found.get("outputs", [])
    ]
    return ("ok", outputs, list(response.raw_output_contents))


def streamed(grpc_url: str, text: str, form: str) -> list[Answer]:
    """Every response of one ModelStreamInfer call to words: its outputs, or its error.

    ``form`` is the stream's wire form: MLServer's ("mlserver", a stream of
    ModelInferResponse; an error ends the call with its status) or Triton's
    ("triton", of ModelStreamInferResponse, each an infer_response or an
    error_message), which the appliance serves and tritonclient reads.
    """
    answers: list[Answer] = []
    reply = pb.ModelInferResponse if form == "mlserver" else pb.ModelStreamInferResponse
    with grpc.insecure_channel(grpc_url) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=reply.FromString,
        )
        try:
            for response in call(iter([words_request(text)]), timeout=60):
                if form == "mlserver":
                    answers.append(plain_response(response))
                elif response.error_message:
                    answers.append(("error", response.error_message))
                else:
                    answers.append(plain_response(response.infer_response))
        except grpc.RpcError as ex:
            answers.append(("error", ex.details()))
    return answers


def test_predict_stream_answers_a_grpc_stream_response_by_response_as_mlserver_does(
    mlserver_streaming: PeerServer, appliance: Appliance
) -> None:
    theirs = streamed(url(mlserver_streaming, "grpc"), "hello big world", "mlserver")
    ours = streamed(url(appliance, "grpc"), "hello big world", "triton")
    assert ours == theirs
    assert len(ours) == 3
    assert ours[0][1][0] == ("word", "BYTES", ["1", "1"], {"content_type": {"stringParam": "str"}})


def test_tritonclient_reads_every_response_of_the_appliance_s_stream(
    appliance: Appliance,
) -> None:
    """tritonclient reads Triton's form only: MLServer's stream of ModelInferResponse
    reaches its callback as errors (each response's model_name read as error_message)."""
    got: list[Any] = []
    client = grpcclient.InferenceServerClient(url(appliance, "grpc"))
    try:
        client.start_stream(callback=lambda result, error: got.append(error or result))
        words = grpcclient.InferInput("text", [1], "BYTES")
        words.set_data_from_numpy(np.array([b"hello big world"], dtype=object))
        client.async_stream_infer("words", [words])
        client.stop_stream()  # waits for the stream's last response
    finally:
        client.close()
    assert [r.as_numpy("word").reshape(-1).tolist() for r in got] == [
        [b"hello"],
        [b"big"],
        [b"world"],
    ]
    assert [r.as_numpy("length").reshape(-1).tolist() for r in got] == [[5], [3], [5]]


def test_a_stream_s_error_follows_the_responses_before_it_with_mlserver_s_message(
    mlserver_streaming: PeerServer, appliance: Appliance
) -> None:
    """MLServer ends the call with the error's status; the appliance sends it as the
    stream's error response (Triton's form)."""
    theirs = streamed(url(mlserver_streaming, "grpc"), "a boom b", "mlserver")
    ours = streamed(url(appliance, "grpc"), "a boom b", "triton")
    assert [answer[0] for answer in ours] == [answer[0] for answer in theirs] == ["ok", "error"]
    assert ours[0] == theirs[0]
    assert "the word boom is not streamed" in theirs[1][1]
    assert theirs[1][1] in ours[1][1]


def sse(http_url: str, text: str, route: str = "infer_stream") -> list[Answer]:
    """Every event of one REST infer_stream call to words: each response's outputs (name,
    datatype, shape, data, parameters), or its error; and the HTTP status of the call."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
    answer = requests.post(f"http://{http_url}/v2/models/words/{route}", json=body, timeout=60)
    found: list[Answer] = [("status", answer.status_code)]
    for line in answer.text.split("\n"):
        if not line.startswith("data: "):
            continue
        event = json.loads(line[len("data: ") :])
        if "error" in event:
            found.append(("error", event["error"]))
            continue
        outputs = [
            (o["name"], o["datatype"], o["shape"], o["data"], o.get("parameters") or {})
            for o in event["outputs"]
        ]
        found.append(("ok", outputs))
    return found


def test_rest_infer_stream_answers_event_by_event_as_mlserver_does(
    mlserver_streaming: PeerServer, appliance: Appliance
) -> None:
    theirs = sse(url(mlserver_streaming, "http"), "hello big world")
    ours = sse(url(appliance, "http"), "hello big world")
    assert ours == theirs
    assert [answer[1][0][3] for answer in ours[1:]] == [["hello"], ["big"], ["world"]]


def test_rest_generate_routes_are_infer_s_as_in_mlserver(
    mlserver_streaming: PeerServer, appliance: Appliance
) -> None:
    """MLServer's generate and generate_stream: infer and infer_stream by other names."""
    theirs = sse(url(mlserver_streaming, "http"), "one two", "generate_stream")
    ours = sse(url(appliance, "http"), "one two", "generate_stream")
    assert ours == theirs == sse(url(appliance, "http"), "one two")
    body = {
        "id": "w1",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["one"]}],
    }
    answers = [
        requests.post(
            f"http://{url(server, 'http')}/v2/models/words/{route}", json=body, timeout=60
        )
        for server in (mlserver_streaming, appliance)
        for route in ("generate", "infer")
    ]
    theirs_generate, theirs_infer, ours_generate, ours_infer = [a.json() for a in answers]
    assert ours_generate == ours_infer
    assert theirs_generate == theirs_infer
    # The envelope differs as infer's does (model_version, an empty parameters): the
    # outputs and the id agree.
    for key in ("id", "model_name", "outputs"):
        assert ours_generate[key] == theirs_generate[key]
