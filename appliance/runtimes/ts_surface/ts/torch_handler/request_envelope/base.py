"""``ts.torch_handler.request_envelope.base``: what every envelope does around a handler.

An envelope takes the requests in an orchestrator's format (KServe v1 or
v2), hands the handler the plain items inside, and wraps its answers back.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any


class BaseEnvelope(abc.ABC):
    def __init__(self, handle_fn: Callable[[Any, Any], Any]) -> None:
        self._handle_fn = handle_fn
        self.context: Any = None

    def handle(self, data: Any, context: Any) -> Any:
        self.context = context
        if data:
            data = self.parse_input(data)
        results = self._handle_fn(data, context)
        if results:
            results = self.format_output(results)
        return results

    @abc.abstractmethod
    def parse_input(self, data: Any) -> Any: ...

    @abc.abstractmethod
    def format_output(self, data: Any) -> Any: ...
