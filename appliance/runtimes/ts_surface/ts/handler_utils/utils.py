"""``ts.handler_utils.utils``: a handler's intermediate (streamed) responses."""

from __future__ import annotations

import importlib
from typing import Any

from ..context import Context


def import_class(class_name: str, module_prefix: str | None = None) -> Any:
    """The class ``module.Class`` (under ``module_prefix`` when given)."""
    if not class_name:
        raise ImportError("class name is not defined")
    module_name, _, name = class_name.rpartition(".")
    if module_prefix:
        module = importlib.import_module(
            f"{module_prefix}.{module_name}" if module_name else module_prefix
        )
    elif module_name:
        module = importlib.import_module(module_name)
    else:
        raise ImportError("module name is not defined.")
    found = getattr(module, name, None)
    if found is None:
        raise ImportError(f"class:{name} not found in module:{module_name}.")
    return found


def send_intermediate_predict_response(
    ret: list[Any], req_id_map: dict[int, str], message: str, code: int, context: Context
) -> None:
    """Send ``ret`` (one item per request of the batch) to the clients now, as one
    part of each request's streamed response; the handler's return value ends it."""
    send = getattr(context, "send_intermediate", None)
    if send is None:
        raise RuntimeError("this context streams no responses")
    send(ret, req_id_map, message, code)
