"""A TorchServe handler's ``data`` from the appliance's requests, and its answers back.

TorchServe's worker gives a handler one dict per request of the batch: each
body or form field by name, its value decoded by its content type (JSON
parsed, ``text/*`` as str, anything else as a bytearray; a value that does
not decode stays bytes), with the request's headers and each field's content
type in the context. A request reaches the model as core/http_body.py says
(a BYTES tensor per field, content types under ``input_parameters``, headers
as ``headers``); a tensor of another type, from a KServe client, becomes the
list of its values.

Each item a handler returns is one request's body, as TorchServe encodes it:
bytes as they are, str as UTF-8, a torch tensor by ``torch.save``, anything
else as JSON with an indent of 2.
"""

from __future__ import annotations

import io
import json
import logging
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.http_body import BODY, CONTENT_TYPE, HEADERS, INPUT_PARAMETERS, REASON, STATUS
from appliance.model import OutputsWithParameters, Request
from appliance.runtimes.interface import text_or_bytes

log = logging.getLogger("appliance.worker")


def request_data(request: Request) -> tuple[dict[str, Any], dict[str, Any]]:
    """One request's ``data`` item and its headers (the request's, and each field's
    ``{"content-type": ...}`` under the field's name, as TorchServe keeps them)."""
    parameters = request.parameters
    per_input = parameters.get(INPUT_PARAMETERS)
    per_input = per_input if isinstance(per_input, Mapping) else {}
    headers: dict[str, Any] = {}
    item: dict[str, Any] = {}
    for name, array in request.inputs.items():
        own = per_input.get(name)
        content_type = str(own.get(CONTENT_TYPE) or "") if isinstance(own, Mapping) else ""
        item[name] = _value(array, content_type)
        headers[name] = {"content-type": content_type or None}
    given = parameters.get(HEADERS)
    if isinstance(given, Mapping):
        headers.update((str(key), str(value)) for key, value in given.items())
    return item, headers


def _value(array: np.ndarray[Any, Any], content_type: str) -> Any:
    if array.dtype.kind != "O":
        return array.tolist()
    if array.size != 1:
        return [bytes(item) for item in array.reshape(-1)]
    raw = bytes(array.reshape(-1)[0])
    if content_type == "application/json":
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            log.warning("Failed json decoding of input data. Forwarding encoded payload")
            return bytearray(raw)
    if content_type.startswith("text"):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            log.warning("Failed utf-8 decoding of input data. Forwarding encoded payload")
            return bytearray(raw)
    return bytearray(raw)


def encode(value: Any) -> bytes:
    """One request's body from what the handler returned for it.

    Raises:
        TypeError: a value JSON cannot hold.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        import torch  # only a handler on torch returns one

        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue()
    return json.dumps(value, indent=2).encode("utf-8")


def answer(
    body: bytes, status: int, reason: str | None, headers: Mapping[str, str]
) -> OutputsWithParameters[Any]:
    """The outputs of one answered request: its body, and how HTTP sends it."""
    array = np.empty(1, dtype=object)
    array[0] = body
    response: dict[str, Any] = {}
    kept = {str(k): str(v) for k, v in headers.items() if k.lower() != "content-type"}
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), None)
    if content_type:
        response[CONTENT_TYPE] = str(content_type)
    if status != 200:
        response[STATUS] = int(status)
    if reason:
        response[REASON] = str(reason)
    if kept:
        response[HEADERS] = kept
    return OutputsWithParameters({BODY: array}, {}, response)


def v2_request(request: Request) -> dict[str, Any]:
    """A request's tensors as the KServe v2 JSON body TorchServe's kservev2 envelope
    parses (BYTES elements as text where they are UTF-8)."""
    inputs = []
    for name, array in request.inputs.items():
        flat = array.reshape(-1)
        if array.dtype.kind == "O":
            data = [text_or_bytes(bytes(item)) for item in flat]
            datatype = "BYTES"
        else:
            data = flat.tolist()
            datatype = dtypes.from_numpy(array.dtype).value
        inputs.append(
            {"name": name, "shape": list(array.shape), "datatype": datatype, "data": data}
        )
    body: dict[str, Any] = {"inputs": inputs}
    if request.request_id:
        body["id"] = request.request_id
    return body


def v2_outputs(response: Any) -> dict[str, np.ndarray[Any, Any]]:
    """The tensors of a KServe v2 response the kservev2 envelope made.

    Raises:
        ValueError: not a v2 response, or an output that does not fit its datatype and shape.
    """
    if isinstance(response, bytes | bytearray | str):
        response = json.loads(response)
    if not isinstance(response, dict) or not isinstance(response.get("outputs"), list):
        raise ValueError("the kservev2 envelope answered no outputs")
    arrays = {}
    for output in response["outputs"]:
        shape = [int(dim) for dim in output["shape"]]
        if output["datatype"] == "BYTES":
            items = [
                str(item).encode() if not isinstance(item, bytes) else item
                for item in output["data"]
            ]
            array = np.empty(len(items), dtype=object)
            array[:] = items
            arrays[str(output["name"])] = array.reshape(shape)
        else:
            dtype = dtypes.to_numpy(DType(output["datatype"]))
            arrays[str(output["name"])] = np.asarray(output["data"], dtype=dtype).reshape(shape)
    return arrays


class FrameSink:
    """What TorchServe's own ``send_intermediate_predict_response`` writes to
    (``context.cl_socket.sendall``), where TorchServe itself is installed: its
    worker's reply frame, read back into each request's body, status and headers."""

    def __init__(self, deliver: Any) -> None:
        self.deliver = deliver

    def sendall(self, frame: bytes | bytearray) -> None:
        for body, content_type, status, reason, headers in read_frame(bytes(frame)):
            if content_type:
                headers = {**headers, "content-type": content_type}
            headers.pop("ts_stream_next", None)  # TorchServe's own marker, not the client's
            self.deliver(answer(body, status, reason, headers))


def read_frame(frame: bytes) -> list[tuple[bytes, str, int, str, dict[str, str]]]:
    """The answers in a TorchServe worker's reply frame (its create_predict_response):
    a code and a message, then per request its id, content type, status, reason
    phrase, headers and body, until a length of -1.

    Raises:
        ValueError: a frame cut short.
    """
    at = 0

    def number() -> int:
        nonlocal at
        if at + 4 > len(frame):
            raise ValueError("a TorchServe reply frame cut short")
        (value,) = struct.unpack_from("!i", frame, at)
        at += 4
        return int(value)

    def chunk() -> bytes:
        nonlocal at
        size = number()
        if size < 0 or at + size > len(frame):
            raise ValueError("a TorchServe reply frame cut short")
        at += size
        return frame[at - size : at]

    number()  # the batch's code
    chunk()  # its message
    found: list[tuple[bytes, str, int, str, dict[str, str]]] = []
    while True:
        size = number()
        if size == -1:
            return found
        at += size  # the request's id
        content_type = chunk().decode()
        status = number()
        reason = chunk().decode()
        headers = {chunk().decode(): chunk().decode() for _ in range(number())}
        found.append((chunk(), content_type, status, reason, headers))
