"""``ts.handler_utils.timer``: ``@timed`` records a handler step's time when
model-config.yaml has ``handler: {profile: true}``."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from typing import Any


def timed(func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)
    def wrap_func(self: Any, *args: Any, **kwargs: Any) -> Any:
        context: Any = getattr(self, "context", None)
        handler = (getattr(context, "model_yaml_config", None) or {}).get("handler")
        if not (isinstance(handler, dict) and handler.get("profile")):
            return func(self, *args, **kwargs)
        start = time.time()
        result = func(self, *args, **kwargs)
        context.metrics.add_time("ts_handler_" + func.__name__, (time.time() - start) * 1000)
        return result

    return wrap_func
