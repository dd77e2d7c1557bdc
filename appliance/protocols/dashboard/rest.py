"""The dashboard's routes on the HTTP port.

    GET  /dashboard          the page (GET / shows it too, to browsers)
    GET  /dashboard/state    the JSON document the page polls (state.py)
    POST /dashboard/online   {"online": true|false}: flip the host's one online flag

The POST takes only ``Content-Type: application/json``: a form on another
site cannot send that without a CORS preflight, which is never granted, so
another origin cannot take the host out of rotation through a visitor's
browser.
"""

from __future__ import annotations

import logging
from typing import Any

import falcon
import orjson

from appliance.client.api import ModelClient
from appliance.errors import ControlError
from appliance.protocols.dashboard import html, state
from appliance.protocols.web import App, guarded

log = logging.getLogger("appliance.dashboard")
MAX_BODY_BYTES = 4096


class _Refused(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _render_failure(req: falcon.Request, resp: falcon.Response, error: Exception) -> None:
    """Answer a failure as {"error": message}."""
    if isinstance(error, _Refused):
        _json(resp, {"error": error.message}, error.status)
    elif isinstance(error, ControlError):
        _json(resp, {"error": f"the master did not take the command: {error}"}, falcon.HTTP_503)
    else:
        log.error("dashboard %s %s failed", req.method, req.path, exc_info=error)
        _json(resp, {"error": "dashboard: internal error; see the log"}, falcon.HTTP_500)


_guarded = guarded(_render_failure)


def _json(resp: falcon.Response, body: Any, status: str = falcon.HTTP_200) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.cache_control = ["no-store"]
    resp.data = orjson.dumps(body)


def render(client: ModelClient) -> str:
    """Return the dashboard page as HTML text."""
    return html.render(state.collect(client))


class PageResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.cache_control = ["no-store"]
        resp.text = render(self.client)


class StateResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        _json(resp, state.collect(self.client))


class OnlineResource:
    def __init__(self, client: ModelClient) -> None:
        self.client = client

    @_guarded
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        online = _read_online(req)
        self.client.set_online(online)
        log.info("dashboard: host set %s by %s", "online" if online else "offline", req.remote_addr)
        _json(resp, {"online": online})


def _read_online(req: falcon.Request) -> bool:
    content_type = (req.content_type or "").split(";", 1)[0].strip().lower()
    if content_type != falcon.MEDIA_JSON:
        raise _Refused(
            falcon.HTTP_415,
            f"POST {html.ONLINE_PATH} takes Content-Type application/json, got "
            f"{content_type or 'none'}",
        )
    body: bytes | None = req.context.body
    if body is None or len(body) > MAX_BODY_BYTES:
        raise _Refused(falcon.HTTP_413, f"the body exceeds {MAX_BODY_BYTES} bytes")
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError as ex:
        raise _Refused(falcon.HTTP_400, f"the body is not JSON: {ex}") from None
    online = message.get("online") if isinstance(message, dict) else None
    if not isinstance(online, bool):
        raise _Refused(falcon.HTTP_400, 'expected {"online": true} or {"online": false}')
    return online


def add_routes(app: App, client: ModelClient) -> None:
    """Mount the dashboard's routes."""
    app.add_route("/dashboard", PageResource(client))
    app.add_route(html.STATE_PATH, StateResource(client))
    app.add_route(html.ONLINE_PATH, OnlineResource(client))
