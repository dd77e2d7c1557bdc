"""The ladder of one HTTP request, rung by rung, on the appliance's own HTTP worker.

Each rung is a gunicorn server with the appliance's worker class
(``appliance.frontends.httpworker.HttpWorker``) and the settings of a running
appliance (its config snapshot), answering KServe REST, GRPS REST, GraphPipe
and UM-Bridge requests with no model and no process hop:

- ``floor``: a bare falcon ASGI app whose routes answer each protocol in
  place (an echo: KServe as floor_app.py, GRPS and UM-Bridge with orjson,
  GraphPipe with its reply built once per distinct request body, by the
  appliance's codec);
- ``middleware``: the same routes behind the appliance's falcon middleware
  (observer with access line and metrics, auth, the body read-ahead) and its
  early refusal of bodies over the limit (frontends/http.py);
- ``codec``: the appliance's own app (frontends/http.py ``create_app``), every
  protocol's routes and codecs, over a model client that answers in place
  (:class:`InPlaceClient`): the metadata of the running appliance's models,
  outputs that are the inputs (identity models only), no ring, no descriptor,
  no model worker;
- ``hop``: the floor's routes, KServe's answered after the request's body
  went over ZeroMQ to a process that sends it straight back (hop_echo.py,
  started with the rung, in its process tree): the floor with the hop to a
  model worker that does nothing, as floor_grpc_app.py's ``aio-hop`` for gRPC.

The whole appliance is the rung above codec: the same request plus the hop.
Runs in the appliance's environment, from bench/peers::

    python ladder_app.py PORT RUNG RUN_DIR WORKERS
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import falcon
import falcon.asgi
import hop_echo
import orjson
from floor_app import HEADER_LENGTH, answer, respond
from gunicorn.app.base import BaseApplication

from appliance.client.api import ModelClient
from appliance.client.call import Outbox
from appliance.client.request import TensorLike
from appliance.client.result import InferResult
from appliance.config.reader import read_snapshot
from appliance.config.settings import ApplianceConfig
from appliance.core.tensor import Tensor
from appliance.core.tree import Tree
from appliance.frontends import auth, http
from appliance.frontends.observe_http import HttpObserver
from appliance.observability import logs
from appliance.protocols.bodies import ReadAhead
from appliance.protocols.graphpipe import codec as graphpipe_codec
from appliance.protocols.graphpipe.request import InferRequest as GraphPipeInferRequest
from appliance.protocols.threads import Threads

RUNGS = ("floor", "middleware", "codec", "hop")
GRPS_OK = {"code": 200, "msg": "OK", "status": "SUCCESS"}


async def body_of(req: falcon.asgi.Request) -> bytes:
    """The body the read-ahead middleware took, or read here (the floor has none)."""
    body: bytes | None = getattr(req.context, "body", None)
    if body is None:
        body = await req.bounded_stream.read()
    return body


class KServeInfer:
    async def on_post(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str
    ) -> None:
        respond(resp, answer(model, await body_of(req), req.get_header(HEADER_LENGTH)))


class KServeHopInfer:
    """KServe's answer after the body's round trip to hop_echo.py."""

    def __init__(self, echo: str) -> None:
        self.hop = hop_echo.Hop(echo)

    async def on_post(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str
    ) -> None:
        body = await self.hop.round_trip(await body_of(req))
        respond(resp, answer(model, body, req.get_header(HEADER_LENGTH)))


class GrpsPredict:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        request = orjson.loads(await body_of(req))
        resp.content_type = "application/json"
        resp.data = orjson.dumps({"status": GRPS_OK, "gtensors": request["gtensors"]})


class GraphPipeInfer:
    def __init__(self) -> None:
        self.replies: dict[bytes, bytes] = {}

    async def on_post(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str
    ) -> None:
        body = await body_of(req)
        reply = self.replies.get(body)
        if reply is None:
            # graphpipe 1.0.4's own encoder fails on today's flatbuffers:
            # the appliance's codec builds it, once.
            request = graphpipe_codec.decode_request(body)
            assert isinstance(request, GraphPipeInferRequest)
            tensors = [graphpipe_codec.to_tensor(t, "input") for t in request.inputs]
            reply = self.replies[body] = graphpipe_codec.encode_infer_response(tensors)
        resp.content_type = "application/octet-stream"
        resp.data = reply


class UmbridgeEvaluate:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        request = orjson.loads(await body_of(req))
        resp.content_type = "application/json"
        resp.data = orjson.dumps({"output": request["input"]})


class Ready:
    async def on_get(self, _req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.status = falcon.HTTP_200


def in_place_app(config: ApplianceConfig, middleware: bool, echo: str | None = None) -> Any:
    """The floor's routes, bare or behind the appliance's middleware; with ``echo``
    (hop_echo.py's address), KServe's through the hop."""
    limit = config.http.max_body_bytes
    layers = [HttpObserver(), *auth.http_middleware(config), ReadAhead(limit, Threads(1, "x"))]
    app = falcon.asgi.App(middleware=layers if middleware else [])
    kserve = KServeInfer() if echo is None else KServeHopInfer(echo)
    app.add_route("/v2/models/{model}/infer", kserve)
    app.add_route("/v2/health/ready", Ready())
    app.add_route("/grps/v1/infer/predict", GrpsPredict())
    app.add_route("/graphpipe/{model}", GraphPipeInfer())
    app.add_route("/Evaluate", UmbridgeEvaluate())
    return http.refusing_early(app, limit) if middleware else app


class InPlaceClient(ModelClient):
    """The appliance's model client, answering every call at once with its inputs.

    Metadata, readiness and config are the running appliance's; a call's
    outputs are its inputs in the model's declared order (identity models).
    """

    def _unary(
        self,
        channel: Outbox,
        body: dict[str, Any],
        inputs: Mapping[str, TensorLike],
        timeout_s: float | None,
    ) -> Any:
        meta = self.metadata(body["model"])
        outputs = {
            out.name: _as_tensor(inputs[given.name])
            for given, out in zip(meta.inputs or (), meta.outputs or (), strict=True)
        }
        yield InferResult(outputs, None)


def _as_tensor(value: TensorLike) -> Any:
    """A decoded input as the output it becomes (the codecs here pass arrays or Tensors)."""
    return value if isinstance(value, Tensor) else Tensor.from_array(value)


class Ladder(BaseApplication):  # type: ignore[misc]
    """gunicorn with the appliance's worker class and HTTP settings, serving one rung."""

    def __init__(
        self, port: int, rung: str, run_dir: Path, workers: int, echo: str | None = None
    ) -> None:
        self.port, self.rung, self.run_dir, self.workers = port, rung, run_dir, workers
        self.echo = echo
        state = orjson.loads((run_dir / "appliance.json").read_bytes())
        config = read_snapshot(Tree(str(state["tree"]), run_dir).snapshot_path)
        # What the appliance's worker class reads of its application.
        self.context = SimpleNamespace(config=config)
        super().__init__()

    def load_config(self) -> None:
        config = self.context.config
        settings = {
            "bind": [f"127.0.0.1:{self.port}"],
            "workers": self.workers,
            "worker_class": "appliance.frontends.httpworker.HttpWorker",
            "timeout": max(1, int(config.http.io_timeout_s)),
            "keepalive": config.http.keepalive_s,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "warning",
            "proc_name": f"ladder: {self.rung}",
            "control_socket_disable": True,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        config = self.context.config
        logs.set_access_log(config.server.access_log)
        if self.rung != "codec":
            return in_place_app(config, middleware=self.rung == "middleware", echo=self.echo)
        client = InPlaceClient.connect(self.run_dir, ring_bytes=1 << 20)
        app = http.create_app(client, Threads(config.http.threads, "http"))
        return http.refusing_early(app, config.http.max_body_bytes)


def main() -> None:
    port, rung, run_dir, workers = sys.argv[1:]
    if rung not in RUNGS:
        raise SystemExit(f"rung is one of {RUNGS}, not {rung!r}")
    if rung != "hop":
        Ladder(int(port), rung, Path(run_dir), int(workers)).run()
        return
    # The echo is this process's child, so the rung's process tree holds it.
    with hop_echo.started() as echo:
        Ladder(int(port), rung, Path(run_dir), int(workers), echo).run()


if __name__ == "__main__":
    main()
