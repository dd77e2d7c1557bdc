"""Request bodies that must be one JSON object, for every protocol that takes them.

Each protocol answers a bad body in its own error form: it hands in the
exception type to raise with the message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

_NUMBERS = (int, float)


def load_object(
    data: bytes | memoryview,
    error: Callable[[str], Exception],
    empty_is_object: bool = False,
    what: str = "the request body",
) -> dict[str, Any]:
    """Parse ``data`` as one JSON object; ``empty_is_object``: blank means ``{}``.

    Raises:
        whatever ``error`` makes: the body is not JSON, or JSON but not an object.
    """
    if empty_is_object and not bytes(data).strip():
        return {}
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as ex:
        raise error(f"{what} is not valid JSON: {ex}") from None
    if not isinstance(value, dict):
        raise error(f"{what} must be a JSON object, not {kind_of(value)}")
    return value


def kind_of(value: Any) -> str:
    """What a JSON value is, in words for an error message."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "nothing (null or missing)"
    return names.get(type(value), "a number" if type(value) in _NUMBERS else type(value).__name__)
