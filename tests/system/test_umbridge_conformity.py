"""What UM-Bridge's protocol conformity suite checks, as our own tests.

SPEC: PROTOCOL-FACTS §5.3 (UM-Bridge/umbridge testing/protocol_conformity_1.0).
The suite always tests models[0] of /Info; these tests run the same checks
against models[0] of the default model order and against ``forward`` and
``rosenbrock`` by name, so the supported and the unsupported branch of every
endpoint run. Requests go out as the suite sends them: JSON text with no
Content-Type header, or no body at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import requests

from tests.system.harness import Appliance, demo_models, running

TIMEOUT_S = 10
INPUT_VALUE = 0.0


def error_schema(kind: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": [kind]},
                    "message": {"type": "string"},
                },
                "required": ["type", "message"],
                "additionalProperties": False,
            }
        },
        "required": ["error"],
        "additionalProperties": False,
    }


def numbers(min_items: int = 1) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "number"}, "minItems": min_items}


def exactly(key: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {key: schema},
        "required": [key],
        "additionalProperties": False,
    }


INFO = {
    "type": "object",
    "properties": {
        "protocolVersion": {"type": "number"},
        "models": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["protocolVersion", "models"],
    "additionalProperties": False,
}
FLAGS = ("Evaluate", "Gradient", "ApplyJacobian", "ApplyHessian")
MODEL_INFO = exactly(
    "support",
    {
        "type": "object",
        "properties": {flag: {"type": "boolean"} for flag in FLAGS},
        "additionalProperties": False,
    },
)
SIZES = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
EVALUATE = exactly("output", {"type": "array", "items": numbers(), "minItems": 1})
DERIVATIVE = exactly("output", numbers())


@pytest.fixture(scope="module")
def served() -> Iterator[Appliance]:
    with running(demo_models(), http={"workers": 1}) as appliance:
        yield appliance


@pytest.fixture(scope="module")
def url(served: Appliance) -> str:
    return f"http://127.0.0.1:{served.ports['http']}"


@pytest.fixture(params=["models[0]", "forward", "rosenbrock"])
def model(request: pytest.FixtureRequest, url: str) -> str:
    if request.param == "models[0]":
        return str(requests.get(f"{url}/Info", timeout=TIMEOUT_S).json()["models"][0])
    return str(request.param)


def post(url: str, endpoint: str, body: dict[str, Any] | None = None) -> requests.Response:
    """POST as the suite does: indented JSON text, no Content-Type."""
    data = None if body is None else json.dumps(body, indent=4)
    reply = requests.post(f"{url}/{endpoint}", headers={}, data=data, timeout=TIMEOUT_S)
    assert reply.headers["Content-Type"] == "application/json"
    return reply


def support(url: str, model: str) -> dict[str, bool]:
    reply = post(url, "ModelInfo", {"name": model})
    assert reply.status_code == 200
    return dict(reply.json()["support"])


def sizes(url: str, model: str) -> tuple[list[int], list[int]]:
    inputs = post(url, "InputSizes", {"name": model}).json()["inputSizes"]
    outputs = post(url, "OutputSizes", {"name": model}).json()["outputSizes"]
    return inputs, outputs


def request_for(url: str, model: str, extra: int = 0) -> dict[str, Any]:
    inputs, _ = sizes(url, model)
    return {"name": model, "config": {}, "input": [[INPUT_VALUE] * (n + extra) for n in inputs]}


def assert_error(reply: requests.Response, status: int, kind: str) -> None:
    assert reply.status_code == status, reply.text
    jsonschema.validate(instance=reply.json(), schema=error_schema(kind))


def test_info(url: str) -> None:
    reply = requests.get(f"{url}/Info", timeout=TIMEOUT_S)
    assert reply.status_code == 200
    jsonschema.validate(instance=reply.json(), schema=INFO)
    assert reply.json()["protocolVersion"] == 1.0
    assert b'"protocolVersion":1.0' in reply.content  # a number, never the string "1.0"


def test_connection_answers_head(url: str) -> None:
    requests.head(url, timeout=TIMEOUT_S)  # any status; it must not hang


def test_model_info(url: str, model: str) -> None:
    reply = post(url, "ModelInfo", {"name": model})
    assert reply.status_code == 200
    jsonschema.validate(instance=reply.json(), schema=MODEL_INFO)
    assert set(reply.json()["support"]) == set(FLAGS)


def test_model_info_with_wrong_model_name(url: str) -> None:
    assert_error(post(url, "ModelInfo", {"name": "wrong_model_name"}), 400, "ModelNotFound")


@pytest.mark.parametrize(
    ("endpoint", "key"), [("InputSizes", "inputSizes"), ("OutputSizes", "outputSizes")]
)
def test_sizes(url: str, model: str, endpoint: str, key: str) -> None:
    reply = post(url, endpoint, {"name": model})
    assert reply.status_code == 200
    jsonschema.validate(instance=reply.json(), schema=exactly(key, SIZES))


def test_evaluate(url: str, model: str) -> None:
    if not support(url, model)["Evaluate"]:
        assert_error(post(url, "Evaluate"), 400, "UnsupportedFeature")
        return
    reply = post(url, "Evaluate", request_for(url, model))
    assert reply.status_code == 200
    jsonschema.validate(instance=reply.json(), schema=EVALUATE)
    _, outputs = sizes(url, model)
    assert [len(vector) for vector in reply.json()["output"]] == outputs
    assert_error(post(url, "Evaluate", request_for(url, model, extra=1)), 400, "InvalidInput")


def test_evaluate_with_wrong_model_name(url: str) -> None:
    assert_error(post(url, "Evaluate", {"name": "wrong_model_name"}), 400, "ModelNotFound")


def test_gradient(url: str, model: str) -> None:
    if not support(url, model)["Gradient"]:
        assert_error(post(url, "Gradient", {"name": model}), 400, "UnsupportedFeature")
        return
    inputs, outputs = sizes(url, model)
    body = request_for(url, model) | {"outWrt": 0, "inWrt": 0, "sens": [0] * outputs[0]}
    reply = post(url, "Gradient", body)
    assert reply.status_code == 200
    jsonschema.validate(instance=reply.json(), schema=DERIVATIVE)
    assert len(reply.json()["output"]) == inputs[0]
    too_long = body | {"input": request_for(url, model, extra=1)["input"]}
    assert_error(post(url, "Gradient", too_long), 400, "InvalidInput")
    assert_error(post(url, "Gradient", body | {"inWrt": len(inputs)}), 400, "InvalidInput")
    assert_error(post(url, "Gradient", body | {"outWrt": len(outputs)}), 400, "InvalidInput")


def test_apply_jacobian(url: str, model: str) -> None:
    if not support(url, model)["ApplyJacobian"]:
        assert_error(post(url, "ApplyJacobian", {"name": model}), 400, "UnsupportedFeature")
        return
    inputs, outputs = sizes(url, model)
    body = request_for(url, model) | {"outWrt": 0, "inWrt": 0, "vec": [INPUT_VALUE] * inputs[0]}
    reply = post(url, "ApplyJacobian", body)
    assert reply.status_code == 200
    jsonschema.validate(instance=reply.json(), schema=DERIVATIVE)
    assert len(reply.json()["output"]) == outputs[0]
    too_long = body | {"input": request_for(url, model, extra=1)["input"]}
    assert_error(post(url, "ApplyJacobian", too_long), 400, "InvalidInput")


def test_apply_hessian(url: str, model: str) -> None:
    if not support(url, model)["ApplyHessian"]:
        assert_error(post(url, "ApplyHessian", {"name": model}), 400, "UnsupportedFeature")
        return
    inputs, outputs = sizes(url, model)
    body = request_for(url, model) | {
        "outWrt": 0,
        "inWrt1": 0,
        "inWrt2": 0,
        "vec": [0] * inputs[0],
        "sens": [0] * outputs[0],
    }
    reply = post(url, "ApplyHessian", body)
    assert reply.status_code == 200
    jsonschema.validate(instance=reply.json(), schema=DERIVATIVE)
    # SPEC: PROTOCOL-FACTS §5.7 — inputSizes[inWrt1], as PyPI 1.2.10 has it.
    assert len(reply.json()["output"]) == inputs[0]
    too_long = body | {"input": request_for(url, model, extra=1)["input"]}
    assert_error(post(url, "ApplyHessian", too_long), 400, "InvalidInput")


@pytest.mark.parametrize("endpoint", ["Gradient", "ApplyJacobian", "ApplyHessian"])
def test_no_body_addresses_models0_and_gets_unsupported_feature(url: str, endpoint: str) -> None:
    # The suite's Evaluate-unsupported check sends no body at all; models[0]
    # of the default order (simple) lacks every derivative, so these stand in.
    first = requests.get(f"{url}/Info", timeout=TIMEOUT_S).json()["models"][0]
    assert not support(url, first)[endpoint]
    assert_error(post(url, endpoint), 400, "UnsupportedFeature")
    assert_error(post(url, f"{endpoint}ShMem"), 400, "UnsupportedFeature")


def test_no_body_to_a_supported_endpoint_is_invalid_input(url: str) -> None:
    assert_error(post(url, "Evaluate"), 400, "InvalidInput")
    assert_error(post(url, "EvaluateShMem"), 400, "InvalidInput")
