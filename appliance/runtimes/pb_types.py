"""The values a Triton Python-backend model and its BLS calls pass around.

:class:`Tensor`, :class:`InferenceResponse`, :class:`TritonError` with its
codes, :class:`TritonModelException`, and the byte tensors' (de)serializers:
what both ``triton_python_backend_utils`` (python_backend_utils.py, which
exports them under Triton's names) and the BLS calls it makes (bls.py) hold,
kept here below both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core import dtypes
from appliance.runtimes.pb_config import numpy_to_triton_type


def serialize_byte_tensor(input_tensor: npt.NDArray[Any]) -> npt.NDArray[np.uint8] | None:
    """BYTES elements as Triton lays them out: a 4-byte little-endian length, then the bytes."""
    if input_tensor.size == 0:
        return None
    return np.frombuffer(dtypes.pack_bytes(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The inverse of :func:`serialize_byte_tensor`: an object array of bytes."""
    data = bytes(encoded_tensor)
    items, at = [], 0
    while at < len(data):
        length = int.from_bytes(data[at : at + 4], "little")
        items.append(data[at + 4 : at + 4 + length])
        at += 4 + length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


class TritonError:
    """An error a model returns in a response (or a BLS call returns to it)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class TritonModelException(Exception):
    """Raised to the model by this module's calls that fail."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class _Capsule:
    """A DLPack capsule as numpy.from_dlpack takes it (it wants ``__dlpack__``)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class Tensor:
    """A named tensor: an input the model got, or an output it returns.

    Args:
        name: the tensor's name in the model's config.
        data: a numpy array (BYTES as an object array of bytes or str).
    """

    def __init__(self, name: str, data: Any, dtype: Any = None) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"tensor {name!r}: expected a numpy array, got {type(data).__name__} "
                "(Tensor.from_dlpack takes DLPack tensors)"
            )
        self._name = name
        self._array = data if dtype is None else data.astype(dtype, copy=False)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> npt.NDArray[Any]:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._array.dtype == np.object_:
            raise TritonModelException(f"tensor {self._name!r}: BYTES tensors have no DLPack form")
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0: every tensor here is in host memory

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        source = capsule if hasattr(capsule, "__dlpack__") else _Capsule(capsule)
        try:
            array = np.from_dlpack(source)
        except (TypeError, RuntimeError, BufferError) as ex:
            raise TritonModelException(
                f"tensor {name!r}: cannot read a DLPack tensor on the CPU: {ex}"
            ) from None
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


class InferenceResponse:
    """What a model answers one request with: its outputs, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or ())
        self._error = error
        # As given (a dict or JSON text): made JSON only when asked for.
        self._parameters: Mapping[str, Any] | str = parameters or {}

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json_text(self._parameters)

    def parameters_given(self) -> dict[str, Any]:
        """The parameters as the model gave them, as a dict (the runtime's)."""
        given = self._parameters
        return dict(json.loads(given) if isinstance(given, str) else given)


def json_text(parameters: Mapping[str, Any] | str) -> str:
    """Parameters, given as a dict or as JSON text, as JSON text."""
    return parameters if isinstance(parameters, str) else json.dumps(parameters)
