"""How every TorchServe answer goes out: its JSON, its failures, its common headers.

TorchServe's frontend prints JSON with Gson (an indent of 2, a newline after)
as ``application/json``, and puts ``x-request-id`` and no-cache headers on
every answer; a failure is its ``{"code", "type", "message"}`` (errors.py).
"""

from __future__ import annotations

import uuid

import falcon

from appliance.protocols.torchserve.errors import encode_error, from_error
from appliance.protocols.web import guarded

NO_CACHE = {
    "Pragma": "no-cache",
    "Cache-Control": "no-cache; no-store, must-revalidate, private",
    "Expires": "Thu, 01 Jan 1970 00:00:00 UTC",
}


def _render_failure(_req: falcon.Request, resp: falcon.Response, error: Exception) -> None:
    failure = from_error(error)
    json_answer(resp, encode_error(failure), failure.status)


# Decorates a responder so that any failure is answered in TorchServe's form.
guarded_json = guarded(_render_failure)


def json_answer(resp: falcon.Response, body: bytes, status: int = 200) -> None:
    resp.status = falcon.code_to_http_status(status)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = body
    common_headers(resp)


def common_headers(resp: falcon.Response) -> None:
    resp.set_headers(NO_CACHE)
    if resp.get_header("x-request-id") is None:
        resp.set_header("x-request-id", str(uuid.uuid4()))
