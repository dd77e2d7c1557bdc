"""GraphPipe routes against a stub client: no default model, and bugs."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import falcon.asgi
import falcon.testing
import numpy as np
import pytest

from appliance.errors import ModelNotFound
from appliance.protocols.bodies import ReadAhead
from appliance.protocols.graphpipe import rest
from appliance.protocols.graphpipe.errors import GraphPipeCode
from appliance.protocols.threads import Threads
from tests.unit.test_graphpipe_encoder import decode_infer_response, encode_infer_request


class StubClient:
    """Serves nothing; ``metadata`` raises what it is told to."""

    def __init__(self, default_model: str, error: Exception) -> None:
        self.config = SimpleNamespace(
            server=SimpleNamespace(default_model=default_model),
            http=SimpleNamespace(max_body_bytes=1 << 20, graphpipe_model=""),
        )
        self.error = error

    def models(self) -> list[str]:
        return ["a", "b"]

    def metadata(self, model: str) -> Any:
        raise self.error


@pytest.fixture(scope="module")
def threads() -> Iterator[Threads]:
    pool = Threads(2, "test")
    yield pool
    pool.shutdown()


def app_for(client: StubClient, threads: Threads) -> falcon.testing.TestClient:
    app = falcon.asgi.App(middleware=[ReadAhead(1 << 20, threads)])
    rest.add_routes(app, client)  # type: ignore[arg-type]
    return falcon.testing.TestClient(app)


def test_without_a_default_model_root_names_the_models(threads: Threads) -> None:
    http = app_for(StubClient("", ModelNotFound("unused")), threads)
    reply = http.simulate_get("/")
    assert reply.status_code == 404
    assert "server.default_model" in reply.text
    assert "a, b" in reply.text
    reply = http.simulate_post("/", body=encode_infer_request([np.ones(1)]))
    assert reply.status_code == 200
    _, errors = decode_infer_response(reply.content)
    assert errors[0][0] == GraphPipeCode.UNKNOWN_MODEL
    assert "server.default_model" in errors[0][1]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_bug_answers_500_text_without_a_traceback(method: str, threads: Threads) -> None:
    http = app_for(StubClient("m", RuntimeError("secret internals")), threads)
    body = encode_infer_request([np.ones(1)]) if method == "POST" else None
    reply = http.simulate_request(method, "/graphpipe/m", body=body)
    assert reply.status_code == 500
    assert reply.headers["content-type"].startswith("text/plain")
    assert "secret" not in reply.text
    assert "internal error" in reply.text
