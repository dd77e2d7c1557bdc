"""KServe v2 REST routes on the HTTP frontend.

SPEC: PROTOCOL-FACTS §2.1 — health answers carry no body; clients decide on
the status code alone (200 yes; otherwise not). Not-ready answers 503 so that
load balancers, which treat any non-2xx as down, agree with tritonclient.
"""

from __future__ import annotations

import falcon

from appliance.client.api import ModelClient
from appliance.protocols.web import App


class LiveResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = falcon.HTTP_200 if self.client.server_live() else falcon.HTTP_503


class ReadyResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = falcon.HTTP_200 if self.client.server_ready() else falcon.HTTP_503


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the KServe v2 REST routes."""
    app.add_route("/v2/health/live", LiveResource(client))
    app.add_route("/v2/health/ready", ReadyResource(client))
