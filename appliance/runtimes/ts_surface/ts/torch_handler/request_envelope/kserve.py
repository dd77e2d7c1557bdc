"""``ts.torch_handler.request_envelope.kserve``: KServe v1's ``{"instances": [...]}``.

The first request's ``instances`` are the handler's data; its answers go
back as ``{"predictions": [...]}`` (``{"explanations": [...]}`` on :explain),
as TorchServe's envelope does.
"""

from __future__ import annotations

import json
from typing import Any

from .base import BaseEnvelope


class KServeEnvelope(BaseEnvelope):
    def parse_input(self, data: Any) -> Any:
        self._data_list = [row.get("data") or row.get("body") for row in data]
        first = self._data_list[0]
        if isinstance(first, bytes | bytearray):
            first = json.loads(first.decode())
        self._inputs = first.get("instances")
        return self._inputs

    def format_output(self, data: Any) -> list[dict[str, Any]]:
        key = "explanations" if self._is_explain() else "predictions"
        return [{key: data}]

    def _is_explain(self) -> bool:
        return bool(self.context and self.context.get_request_header(0, "explain") == "True")
