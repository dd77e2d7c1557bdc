"""TorchServe's management API over REST (the operations: management.py)::

    GET    /models[?limit=N&next_page_token=T]
    GET    /models/{m}[/{v}|/all]
    POST   /models?url=F.mar[&model_name=&initial_workers=&batch_size=&max_batch_delay=
                   &synchronous=]
    PUT    /models/{m}[/{v}]?min_worker=N[&max_worker=&synchronous=]
    DELETE /models/{m}[/{v}]
    PUT    /models/{m}/{v}/set-default

Its port (``http.management_port``, 8081 for a model store) answers these
paths alone (:func:`is_management`); the HTTP port answers them too.
"""

from __future__ import annotations

import falcon

from appliance.client.api import ModelClient
from appliance.protocols.torchserve import management
from appliance.protocols.torchserve.answers import guarded_json, json_answer
from appliance.protocols.torchserve.errors import pretty
from appliance.protocols.web import App


def _send(resp: falcon.Response, answer: management.Answer) -> None:
    json_answer(resp, pretty(answer[1]), answer[0])


class Models:
    """``/models``: the list (GET) and registration (POST)."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @guarded_json
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, management.list_models(self.client, req.params))

    @guarded_json
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _send(resp, management.register(self.client, req.params))


class Model:
    """``/models/{m}[/{v}]``: describe (GET), scale (PUT), unregister (DELETE)."""

    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @guarded_json
    def on_get(
        self, _req: falcon.Request, resp: falcon.Response, model: str, version: str | None = None
    ) -> None:
        _send(resp, management.describe(self.client, model, version))

    @guarded_json
    def on_put(
        self, req: falcon.Request, resp: falcon.Response, model: str, version: str | None = None
    ) -> None:
        _send(resp, management.scale(self.client, model, version, req.params))

    @guarded_json
    def on_delete(
        self, _req: falcon.Request, resp: falcon.Response, model: str, version: str | None = None
    ) -> None:
        _send(resp, management.unregister(self.client, model, version))


class SetDefault:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @guarded_json
    def on_put(self, _req: falcon.Request, resp: falcon.Response, model: str, version: str) -> None:
        _send(resp, management.set_default(self.client, model, version))


def is_management(path: str) -> bool:
    """A path of the management API (the one its port answers), its token API's too
    (answered by the auth layer, frontends/auth.py, where token authorization is on)."""
    return path in ("/models", "/token") or path.startswith("/models/")


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the management API."""
    app.add_route("/models", Models(client))
    model = Model(client)
    app.add_route("/models/{model}", model)
    app.add_route("/models/{model}/{version}", model)
    app.add_route("/models/{model}/{version}/set-default", SetDefault(client))
