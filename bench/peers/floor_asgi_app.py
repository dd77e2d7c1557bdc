"""floor_app.py's answers as a falcon ASGI app: the floor of the appliance's HTTP stack.

The appliance's HTTP workers are uvicorn's worker class under gunicorn
serving a falcon ASGI app; this is the same stack answering in place, with
no model and no process hop, and it runs under every ASGI worker class
bench/servers.py's FLOOR_KINDS names. Runs in bench/.peers/floor, like
floor_app.py::

    gunicorn -k uvicorn_worker.UvicornWorker -w 2 floor_asgi_app:app
"""

from __future__ import annotations

import falcon
import falcon.asgi
from floor_app import HEADER_LENGTH, answer, respond


class Infer:
    async def on_post(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str
    ) -> None:
        body = await req.bounded_stream.read()
        respond(resp, answer(model, body, req.get_header(HEADER_LENGTH)))


class Ready:
    async def on_get(self, _req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.status = falcon.HTTP_200


app = falcon.asgi.App()
app.add_route("/v2/models/{model}/infer", Infer())
app.add_route("/v2/health/ready", Ready())
