"""The floor of a Python HTTP frontend: falcon under gunicorn, answering in place.

Runs in bench/.peers/floor (the same falcon, gunicorn and orjson versions as
the appliance), never in the appliance's environment. It speaks just enough
of KServe v2 REST for tritonclient.http: ``POST /v2/models/<m>/infer``
returns each input as an output (named as the request asks), with the binary
tensor extension or JSON tensors as sent. No model, no process hop: what is
left is what any falcon+gunicorn frontend pays per request. Run with::

    gunicorn -k gthread --threads 8 -w 2 floor_app:app
"""

from __future__ import annotations

import falcon
import orjson

HEADER_LENGTH = "Inference-Header-Content-Length"


def answer(model: str, body: bytes, header_length: str | None) -> tuple[bytes, str, int | None]:
    """The reply to an infer request: (body, content type, JSON header length)."""
    split = int(header_length) if header_length else len(body)
    request = orjson.loads(body[:split])
    wanted = [o["name"] for o in request.get("outputs", ())]
    outputs = []
    for index, tensor in enumerate(request["inputs"]):
        output = {
            "name": wanted[index] if index < len(wanted) else f"OUTPUT{index}",
            "datatype": tensor["datatype"],
            "shape": tensor["shape"],
        }
        if "data" in tensor:
            output["data"] = tensor["data"]
        else:
            output["parameters"] = {"binary_data_size": tensor["parameters"]["binary_data_size"]}
        outputs.append(output)
    header = orjson.dumps({"model_name": model, "outputs": outputs})
    if header_length:
        return header + body[split:], "application/octet-stream", len(header)
    return header, "application/json", None


def respond(resp: falcon.Response, reply: tuple[bytes, str, int | None]) -> None:
    data, content_type, header_length = reply
    if header_length is not None:
        resp.set_header(HEADER_LENGTH, str(header_length))
    resp.content_type = content_type
    resp.data = data


class Infer:
    def on_post(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        body = req.bounded_stream.read()
        respond(resp, answer(model, body, req.get_header(HEADER_LENGTH)))


class Ready:
    def on_get(self, _req: falcon.Request, resp: falcon.Response) -> None:
        resp.status = falcon.HTTP_200


app = falcon.App()
app.add_route("/v2/models/{model}/infer", Infer())
app.add_route("/v2/health/ready", Ready())
