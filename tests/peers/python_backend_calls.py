"""The calls test_python_backend_oracle.py makes of Triton and of the appliance, and
the answers that differ on purpose.

Each :class:`~tests.peers.oracle.Call` is one thing a user does with tritonclient
against the Python-backend models of tests/data/python_models (infer, read
metadata and config, call BLS, drive sequences, list the repository); the test
sends each to both servers and compares what comes back.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.peers.oracle import Call, at_once, outputs, tensor
from tests.system.harness import ROOT

MODELS = ROOT / "tests" / "data" / "python_models"
F4 = np.arange(8, dtype=np.float32).reshape(2, 4)
NINE_ROWS = np.zeros((9, 4), dtype=np.float32)


def add_sub(module: ModuleType, a: np.ndarray, b: np.ndarray, dtype: str = "FP32") -> list[Any]:
    return [tensor(module, "INPUT0", a, dtype), tensor(module, "INPUT1", b, "FP32")]


def misbehave(do: str, *words: str) -> Call:
    """misbehaving's execute doing ``do``; its error names ``words``."""
    x = np.ones(2, dtype=np.float32)

    def infer(m: ModuleType, c: Any) -> dict[str, Any]:
        return outputs(
            c.infer("misbehaving", [tensor(m, "X", x, "FP32")], parameters={"do": do}), "Y"
        )

    return Call(f"misbehaving {do}", infer, words)


def metadata(model: str) -> Call:
    return Call(
        f"metadata {model}",
        lambda m, c: (
            c.get_model_metadata(model, as_json=True)
            if m is grpcclient
            else c.get_model_metadata(model)
        ),
        (model,),
    )


def config_tensors(model: str) -> Call:
    """What a client reads from a model's config: the batch size and the tensors."""

    def read(m: ModuleType, c: Any) -> dict[str, Any]:
        config = c.get_model_config(model, as_json=True) if m is grpcclient else None
        config = config["config"] if config else c.get_model_config(model)

        def tensors(kind: str) -> list[tuple[str, str, list[int]]]:
            return [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config[kind]]

        return {
            "name": config["name"],
            "backend": config["backend"],
            "max_batch_size": int(config.get("max_batch_size", 0)),
            "input": tensors("input"),
            "output": tensors("output"),
            "dynamic_batching": "dynamic_batching" in config,
            "decoupled": config.get("model_transaction_policy", {}).get("decoupled", False),
        }

    return Call(f"config {model}", read)


BLS_CALLS = ("add_sub", "nope", "misbehaving_error", "square")
BLS_CALLS += tuple(f"async_{name}" for name in BLS_CALLS)
BLS_CALLS += ("sequence",)  # three steps of one sequence of accumulate
# Unloads and loads auto_declared again (Triton's model loading API), then one call
# with preferred_memory and trace: after the calls that use auto_declared.
LATE_BLS_CALLS = ("manage",)


def errors_named(seen: Any) -> Any:
    """A BLS call's answers with each error's message reduced to what it names
    (the model called, or the called model's own message)."""
    if isinstance(seen, list):
        return [errors_named(each) for each in seen]
    if not isinstance(seen, dict) or not isinstance(seen.get("error"), str):
        return seen
    if "error" in seen:
        message = seen["error"]
        return {"error": [word for word in ("'nope'", "X must be positive") if word in message]}
    return seen


def bls(name: str) -> Call:
    """bls_caller calling another model as ``name`` says; what its call returned."""

    def infer(m: ModuleType, c: Any) -> Any:
        x = tensor(m, "X", np.arange(4, dtype=np.float32), "FP32")
        result = c.infer("bls_caller", [x], parameters={"call": name})
        return errors_named(json.loads(result.as_numpy("SEEN")[0]))

    return Call(f"BLS {name}", infer)


def who(m: ModuleType, c: Any, request_id: str, sleep_s: float = 0.0) -> dict[str, Any]:
    """What identify's execute saw: the request's id, the instance's kind and device."""
    x = tensor(m, "X", np.array([sleep_s], np.float32), "FP32")
    seen = json.loads(c.infer("identify", [x], request_id=request_id).as_numpy("WHO")[0])
    return {key: value for key, value in seen.items() if key != "model_instance_name"}


def sequences(m: ModuleType, c: Any, steps: list[tuple[int, int, str]]) -> list[dict[str, Any]]:
    """accumulate's answers to ``steps``: (sequence id, value, "start"/"end"/"both"/"")."""
    answers = []
    for sequence, value, flag in steps:
        x = tensor(m, "VALUE", np.array([[value]], np.int32), "INT32")
        result = c.infer(
            "accumulate",
            [x],
            sequence_id=sequence,
            sequence_start=flag in ("start", "both"),
            sequence_end=flag in ("end", "both"),
        )
        answers.append(outputs(result, "SUM", "SEEN"))
    return answers


# Two sequences side by side.
INTERLEAVED = [(11, 3, "start"), (12, 4, "start"), (11, 5, ""), (12, 6, "end"), (11, 7, "end")]


def sequence_controls(m: ModuleType, c: Any) -> list[tuple[str, str]]:
    """What a client reads of accumulate's config: its control inputs, by name and kind."""
    config = c.get_model_config("accumulate", as_json=True) if m is grpcclient else None
    config = config["config"] if config else c.get_model_config("accumulate")
    # Protobuf's JSON leaves out an enum's first value (CONTROL_SEQUENCE_START).
    return [
        (item["name"], item["control"][0].get("kind", "CONTROL_SEQUENCE_START"))
        for item in config["sequence_batching"]["control_input"]
    ]


def instance_names(url: str) -> set[str]:
    """The instances that answer three requests at once, each holding its instance 0.5 s."""
    names: set[str] = set()

    def one(n: int) -> None:
        client = httpclient.InferenceServerClient(url)
        x = tensor(httpclient, "X", np.array([0.5], np.float32), "FP32")
        seen = json.loads(client.infer("identify", [x]).as_numpy("WHO")[0])
        names.add(seen["model_instance_name"])
        client.close()

    at_once(one, 3)
    return names


def index(m: ModuleType, c: Any) -> list[tuple[str, str, str, bool]]:
    if m is grpcclient:
        entries = c.get_model_repository_index(as_json=True).get("models", [])
    else:
        entries = c.get_model_repository_index()
    return [(e["name"], e.get("version", ""), e["state"], "reason" in e) for e in entries]


CALLS = [
    Call(
        "infer add_sub",
        lambda m, c: outputs(c.infer("add_sub", add_sub(m, F4, F4 + 1)), "OUTPUT0", "OUTPUT1"),
    ),
    Call(
        "infer auto_declared",
        lambda m, c: outputs(
            c.infer("auto_declared", [tensor(m, "IN", np.ones((3, 2)), "FP64")]), "DOUBLED"
        ),
    ),
    Call("unknown model", lambda m, c: c.infer("nope", add_sub(m, F4, F4)), ("nope",)),
    Call(
        "unknown input",
        lambda m, c: c.infer(
            "add_sub", [tensor(m, "INPUTX", F4, "FP32"), tensor(m, "INPUT1", F4, "FP32")]
        ),
        ("INPUTX", "add_sub"),
    ),
    Call(
        "missing input",
        lambda m, c: c.infer("add_sub", [tensor(m, "INPUT0", F4, "FP32")]),
        ("INPUT1", "add_sub"),
    ),
    Call(
        "wrong datatype",
        lambda m, c: c.infer("add_sub", add_sub(m, F4.astype(np.int32), F4, "INT32")),
        ("INPUT0", "INT32", "FP32", "add_sub"),
    ),
    Call(
        "wrong shape",
        lambda m, c: c.infer("add_sub", add_sub(m, F4.reshape(4, 2), F4.reshape(4, 2))),
        ("add_sub", "[4,2]"),
    ),
    Call(
        "batch over max_batch_size",
        lambda m, c: c.infer("add_sub", add_sub(m, NINE_ROWS, NINE_ROWS)),
        ("add_sub", "<= 8"),
    ),
    Call(
        "unknown output",
        lambda m, c: c.infer(
            "add_sub", add_sub(m, F4, F4), outputs=[m.InferRequestedOutput("NOPE")]
        ),
        ("NOPE", "add_sub"),
    ),
    misbehave("echo"),
    misbehave("raise", "misbehaving", "ValueError: asked to raise"),
    misbehave("count", "misbehaving", "InferenceResponse"),
    misbehave("error", "X must be positive"),
    misbehave("object", "misbehaving", "InferenceResponse", "dict"),
    metadata("add_sub"),
    metadata("auto_declared"),
    metadata("batch_probe"),
    metadata("nope"),
    config_tensors("add_sub"),
    config_tensors("auto_declared"),
    config_tensors("batch_probe"),
    config_tensors("square_stream"),
    metadata("square_stream"),
    Call(
        "one inference of a decoupled model",
        lambda m, c: c.infer("square_stream", [tensor(m, "IN", np.array([2], np.int32), "INT32")]),
        ("decoupled",),
    ),
    *(bls(name) for name in BLS_CALLS),
    Call("a request's id reaches execute", lambda m, c: who(m, c, "id-7")),
    Call("a request without an id", lambda m, c: who(m, c, "")),
    Call("a sequence model's steps", lambda m, c: sequences(m, c, INTERLEAVED)),
    Call("a one-step sequence", lambda m, c: sequences(m, c, [(21, 9, "both")])),
    Call(
        "a step of a sequence never started",
        lambda m, c: sequences(m, c, [(31, 1, "")]),
        ("accumulate", "31"),
    ),
    Call(
        "a step without a sequence id",
        lambda m, c: sequences(m, c, [(0, 1, "start")]),
        ("accumulate",),
    ),
    metadata("accumulate"),
    config_tensors("accumulate"),
    Call("a sequence model's control inputs", sequence_controls),
    Call("server ready", lambda m, c: c.is_server_ready()),
    Call("failed model's readiness", lambda m, c: c.is_model_ready("import_fails")),
    *(bls(name) for name in LATE_BLS_CALLS),
    Call("repository index", index),
    Call(
        "load a model whose initialize raises",
        lambda m, c: c.load_model("initialize_fails"),
        ("initialize_fails", "weights.bin is missing"),
    ),
]
# Answered otherwise on purpose: call -> (REST status, gRPC status, why).
ON_PURPOSE = {
    "infer a failed model": (
        "503",
        "StatusCode.UNAVAILABLE",
        "the appliance keeps retrying a failed load (with backoff) and says why; Triton "
        "answers 404 'has no available versions'",
    ),
}
ON_PURPOSE_CALLS = [
    Call(
        "infer a failed model",
        lambda m, c: c.infer("import_fails", [tensor(m, "X", np.ones(1, np.float32), "FP32")]),
        ("import_fails",),
    )
]
