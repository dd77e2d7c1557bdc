"""A response's outputs together with what the model said of the response itself.

Apart from inference.py because it is a list: the encoders take it as the
plain list of outputs it also is, and mypyc (appliance/native.py) compiles
no subclass of list, so this module stays Python while inference.py is
compiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from appliance.protocols.kserve.inference import OutputData


class ResponseOutputs(list[OutputData]):
    """A response's outputs to encode, with what the model said of the response
    itself (its ``parameters``: MLServer's ``content_type`` of a whole response)."""

    __slots__ = ("parameters",)

    def __init__(self, outputs: list[OutputData], parameters: Mapping[str, Any]) -> None:
        super().__init__(outputs)
        self.parameters = parameters


def response_parameters(outputs: Sequence[OutputData]) -> Mapping[str, Any]:
    """The response's own parameters (none for a plain list of outputs)."""
    return outputs.parameters if isinstance(outputs, ResponseOutputs) else {}
