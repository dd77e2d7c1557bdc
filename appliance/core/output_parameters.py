"""Parameters a model gives with its outputs: each output's, and the response's.

A KServe response carries a ``parameters`` object for each output and one for
itself; MLServer's runtimes set each output's ``content_type`` there ("np",
"str", "pd", ...), and a response's when it was encoded whole (a pandas
DataFrame: "pd"). A model returns them with its outputs as
:class:`OutputsWithParameters`. The model worker keeps them beside the outputs
it has checked (:func:`carried`) and sends each output's in its entry of the
reply's body (a fifth element, see core/descriptor.py), the response's as the
body's ``parameters``; the KServe encoders render them (REST: the output's and
the response's ``parameters`` objects; gRPC: their ``parameters`` maps). The
other protocols have no place for them and leave them out. Neither an
ensemble's outputs nor a response-cache hit carries them.

Values must survive JSON: text, numbers, booleans, and lists and objects of
them. Any other value is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

Parameters = dict[str, dict[str, Any]]
T = TypeVar("T")


class OutputsWithParameters(dict[str, T]):
    """A model's outputs by name, with each output's parameters.

    Example::

        return OutputsWithParameters(
            {"y": y, "label": labels},
            {"y": {"content_type": "np"}, "label": {"content_type": "str"}},
        )

    Parameters of a name that is not an output are dropped. ``response``: the
    response's own parameters (``{"content_type": "pd"}``).
    """

    __slots__ = ("parameters", "response")

    def __init__(
        self,
        outputs: Mapping[str, T],
        parameters: Mapping[str, Mapping[str, Any]],
        response: Mapping[str, Any] | None = None,
    ):
        super().__init__(outputs)
        self.parameters: Parameters = {}
        for name, values in parameters.items():
            plain = _plain_object(values) if isinstance(values, Mapping) else None
            if name in self and plain:
                self.parameters[str(name)] = plain
        self.response: dict[str, Any] = _plain_object(response) if response else {}


def parameters_of(outputs: object) -> Parameters:
    """The per-output parameters ``outputs`` carries ({} for a plain mapping)."""
    found = getattr(outputs, "parameters", None)
    return found if isinstance(found, dict) else {}


def response_parameters_of(outputs: object) -> dict[str, Any]:
    """The response's parameters ``outputs`` carries ({} for a plain mapping)."""
    found = getattr(outputs, "response", None)
    return found if isinstance(found, dict) else {}


def has_parameters(outputs: object) -> bool:
    return isinstance(outputs, OutputsWithParameters) and bool(
        outputs.parameters or outputs.response
    )


def carried(source: object, outputs: dict[str, T]) -> dict[str, T]:
    """``outputs`` with the parameters ``source`` gave to those of its outputs it holds.

    The worker checks a model's outputs into new mappings (arrays become
    tensors, a batch's rows are cut per request); this keeps the parameters.
    """
    if not has_parameters(source):
        return outputs
    return OutputsWithParameters(outputs, parameters_of(source), response_parameters_of(source))


def response_from_body(body: Mapping[str, Any] | None) -> dict[str, Any]:
    """The response's parameters in a reply's body ({} when it has none)."""
    found = body.get("parameters") if body else None
    return found if isinstance(found, dict) else {}


def from_body(body: Mapping[str, Any] | None) -> Parameters:
    """The per-output parameters of a reply's body ({} when it has none)."""
    if not body:
        return {}
    return {
        str(entry[0]): entry[4]
        for entry in body.get("tensors", ())
        if len(entry) > 4 and isinstance(entry[4], dict)
    }


def _plain_object(values: Mapping[Any, Any]) -> dict[str, Any]:
    plain = {}
    for key, value in values.items():
        kept = _plain(value)
        if kept is not _DROP:
            plain[str(key)] = kept
    return plain


_DROP = object()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | bool | int | float):
        return value if value is not None else _DROP
    if isinstance(value, Mapping):
        return _plain_object(value)
    if isinstance(value, list | tuple):
        items = [_plain(item) for item in value]
        return [item for item in items if item is not _DROP]
    return _DROP
