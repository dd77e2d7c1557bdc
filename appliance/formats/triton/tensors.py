"""config.pbtxt's ``input`` and ``output`` tensors, read into ``inputs`` and ``outputs`` tables.

Each tensor's name, type (TYPE_STRING is BYTES) and shape (``dims`` exclude
the batch dimension when max_batch_size > 0, as in Triton), an input's
``optional``, and a tensor's ``reshape`` (both shapes go to the ``reshape``
option: worker/reshape.py). Apart from the rest of the config
(config_pbtxt.py) because an ensemble's declared tensors are read the same.
"""

from __future__ import annotations

from typing import Any

from appliance._generated import triton_model_config_pb2 as mc
from appliance.formats.triton.sequences import PbtxtError, is_set


class TensorFields:
    """The input and output part of a config.pbtxt reader (pbtxt._Reader)."""

    config: Any
    notes: list[str]
    reshapes: dict[str, dict[str, list[int]]]

    def _tensor(self, kind: str, index: int, tensor: Any, batched: bool) -> dict[str, Any]:
        where = f"{kind}[{index}] ({tensor.name or 'no name'})"
        if not tensor.name:
            raise PbtxtError(f"{where}: name is missing")
        for field in ("is_shape_tensor", "allow_ragged_batch"):
            if is_set(tensor, field):
                raise PbtxtError(f"{where}.{field}: not served")
        for field in ("format", "label_filename", "is_non_linear_format_io"):
            if is_set(tensor, field):
                self.notes.append(f"{where}.{field} is not used")
        if tensor.data_type in (mc.TYPE_INVALID, mc.TYPE_BF16):
            name = mc.DataType.Name(tensor.data_type)
            raise PbtxtError(f"{where}.data_type: {name} is not one of the appliance's types")
        dtype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        dims = [int(d) for d in tensor.dims]
        if any(d < -1 for d in dims):
            raise PbtxtError(f"{where}.dims: {dims} holds a size below -1")
        shape = [-1, *dims] if batched else dims
        if tensor.HasField("reshape"):
            shape = self._reshape(where, tensor, shape, batched)
        table: dict[str, Any] = {
            "name": tensor.name,
            "dtype": "BYTES" if dtype == "STRING" else dtype,
            "shape": shape,
        }
        if kind == "input" and tensor.optional:
            table["optional"] = True
        return table

    def _reshape(self, where: str, tensor: Any, client: list[int], batched: bool) -> list[int]:
        """The shape the model sees of a reshaped tensor (its table's shape, which a
        runtime checks against the model file); both shapes go to the ``reshape`` option."""
        wanted = [int(d) for d in tensor.reshape.shape]
        if any(d < -1 for d in wanted) or wanted.count(-1) > 1:
            raise PbtxtError(
                f"{where}.reshape.shape: {wanted}: sizes >= 0 and at most one -1 are served"
            )
        dims = client[1:] if batched else client
        if -1 not in wanted and -1 not in dims and _count(wanted) != _count(dims):
            raise PbtxtError(
                f"{where}.reshape.shape: {wanted} does not hold the elements of dims "
                f"{[int(d) for d in tensor.dims]}"
            )
        model = [-1, *wanted] if batched else wanted
        self.reshapes[tensor.name] = {"client": client, "model": model}
        return model


def _count(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
