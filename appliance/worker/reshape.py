"""Tensors a model sees in another shape than its clients (Triton's ``reshape``).

A model's ``reshape`` option maps a tensor's name to its two shapes, each
with the leading -1 of a batched model: ``client`` (what requests send and
replies carry: the config's ``dims``) and ``model`` (what the model takes or
makes: ``reshape.shape``). The worker checks requests against the client's
shapes, hands the model its own, and turns the model's outputs back before
checking them, so nothing else in the worker knows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import TensorSpec
from appliance.errors import BadRequest, ModelFailed

OPTION = "reshape"
Array = npt.NDArray[Any]


class Reshapes:
    def __init__(self, table: Mapping[str, Mapping[str, list[int]]], batched: bool) -> None:
        self.batched = batched
        self.model = {name: tuple(shapes["model"]) for name, shapes in table.items()}
        self.client = {name: tuple(shapes["client"]) for name, shapes in table.items()}

    @classmethod
    def of(cls, options: Mapping[str, Any], batched: bool) -> Reshapes | None:
        table = options.get(OPTION)
        return cls(table, batched) if table else None

    def declared(self, metadata: ModelMetadata) -> ModelMetadata:
        """The metadata clients see: the client's shapes of the reshaped tensors."""

        def client_view(specs: tuple[TensorSpec, ...] | None) -> tuple[TensorSpec, ...] | None:
            if specs is None:
                return None
            return tuple(
                dataclasses.replace(spec, shape=self.client[spec.name])
                if spec.name in self.client
                else spec
                for spec in specs
            )

        return dataclasses.replace(
            metadata, inputs=client_view(metadata.inputs), outputs=client_view(metadata.outputs)
        )

    def inputs(self, arrays: dict[str, Array], model: str) -> dict[str, Array]:
        """The arrays as the model takes them.

        Raises:
            BadRequest: an input's elements do not fill the model's shape of it.
        """
        taken = {}
        for name, array in arrays.items():
            try:
                taken[name] = self._as(array, self.model.get(name))
            except ValueError:
                raise BadRequest(
                    f"model {model} input {name}: shape {list(array.shape)} cannot be reshaped "
                    f"to the model's {list(self.model[name])} (reshape)"
                ) from None
        return taken

    def outputs(self, produced: Any, model: str) -> Any:
        """The model's outputs in the client's shapes.

        Raises:
            ModelFailed: an output does not hold the elements its client shape needs.
        """
        if not isinstance(produced, Mapping):
            return produced  # the reply's check says what is wrong
        turned = dict(produced)
        for name, shape in self.client.items():
            if name in turned:
                try:
                    turned[name] = self._as(np.asarray(turned[name]), shape)
                except ValueError:
                    given = list(np.shape(turned[name]))
                    raise ModelFailed(
                        f"model {model} output {name}: shape {given} cannot be reshaped to "
                        f"the declared {list(shape)} (reshape)"
                    ) from None
        return turned

    def _as(self, array: Array, shape: tuple[int, ...] | None) -> Array:
        if shape is None:
            return array
        if self.batched:
            return array.reshape((array.shape[0], *shape[1:]))
        return array.reshape(shape)
