"""``ts.torch_handler.request_envelope.kservev2``: KServe v2's ``{"inputs": [...]}``.

The first request's inputs are the handler's data (each ``{"name", "shape",
"datatype", "data"}``, a BYTES input's data its first element, another's
reshaped to its shape); each item the handler returns becomes an output
named after the input at its place, flattened, in a v2 response with the
request's id (or TorchServe's request id), the model's name and version.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .base import BaseEnvelope

_TO_NUMPY = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "byte",
}
_TO_DATATYPE = {value: key for key, value in _TO_NUMPY.items()}
_TO_DATATYPE["object"] = "BYTES"
_TO_DATATYPE["U"] = "BYTES"


def _to_datatype(dtype: np.dtype[Any]) -> str:
    name = str(dtype)
    return _TO_DATATYPE[name if name in _TO_DATATYPE else dtype.kind]


class KServev2Envelope(BaseEnvelope):
    def parse_input(self, data: Any) -> Any:
        bodies = [row.get("data") or row.get("body") for row in data]
        if isinstance(bodies[0], bytes | bytearray):
            bodies = [json.loads(bytes(body).decode("utf8")) for body in bodies]
        first = bodies[0]
        names = []
        for item in first["inputs"]:
            if item["datatype"] == "BYTES":
                item["data"] = item["data"][0]
            else:
                item["data"] = np.array(item["data"]).reshape(tuple(item["shape"])).tolist()
            names.append(item["name"])
        self.context.input_names = names
        request_id = first.get("id")
        if request_id and str(request_id).strip():
            self.context.input_request_id = request_id
        return first.get("inputs")

    def format_output(self, data: Any) -> list[dict[str, Any]]:
        response: dict[str, Any] = {}
        if hasattr(self.context, "input_request_id"):
            response["id"] = self.context.input_request_id
            del self.context.input_request_id
        else:
            response["id"] = self.context.get_request_id(0)
        model = self.context.manifest.get("model")
        response["model_name"] = model.get("modelName")
        response["model_version"] = model.get("modelVersion")
        names = self.context.input_names
        del self.context.input_names
        response["outputs"] = [self._to_json(item, names[index]) for index, item in enumerate(data)]
        return [response]

    def _to_json(self, data: Any, name: str) -> dict[str, Any]:
        flat = np.array(data).flatten()
        return {
            "name": name,
            "datatype": _to_datatype(flat.dtype),
            "data": flat.tolist(),
            "shape": list(flat.shape),
        }
