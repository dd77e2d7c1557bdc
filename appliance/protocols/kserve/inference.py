"""The shape of a KServe inference request, whichever transport carried it.

Both codecs (REST JSON + binary in ``codec``, protobuf in ``pbcodec``) decode
into an :class:`InferRequest`; ``infer`` runs it. The checks every
transport shares live here too: datatypes, shapes, byte sizes against
shapes, and the shared-memory tensor parameters. Pure: no I/O, no web or
RPC library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.http_body import INPUT_PARAMETERS
from appliance.core.tensor import Tensor
from appliance.protocols.kserve.errors import DecodeError

# Request parameters the frontend consumes itself; the rest go to the model.
# SPEC: PROTOCOL-FACTS §2.2 (timeout, in microseconds) and §2.3
# (binary_data_output); Triton's stream flag triton_enable_empty_final_response.
TRANSPORT_PARAMETERS = frozenset(
    {"binary_data_output", "timeout", "triton_enable_empty_final_response"}
)
# An input's parameters that say where its bytes lie, not what they mean.
INPUT_TRANSPORT_PARAMETERS = frozenset(
    {
        "binary_data_size",
        "shared_memory_region",
        "shared_memory_byte_size",
        "shared_memory_offset",
    }
)
# The largest dimension count a request may claim.
MAX_RANK = 64
# The largest product of a shape's non-zero dims: numpy refuses an array
# whose size in bytes passes 2**63 even when a zero dim leaves it empty.
MAX_ELEMENTS = 1 << 59


# PERF: the request shapes below write their ``__init__`` out, as InferRequest
# does: compiled (appliance/native.py), a generated one still runs as Python,
# and these are made on every request. Not frozen, for that; nothing changes
# them after they are made.


@dataclass(slots=True, init=False)
class ShmRef:
    """Where a tensor lies in a registered system shared-memory region."""

    region: str
    byte_size: int
    offset: int

    def __init__(self, region: str, byte_size: int, offset: int = 0) -> None:
        self.region = region
        self.byte_size = byte_size
        self.offset = offset


@dataclass(slots=True, init=False)
class InputTensor:
    """One decoded input: its data, or where it lies in shared memory."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    data: Tensor | None
    shm: ShmRef | None

    def __init__(
        self,
        name: str,
        dtype: DType,
        shape: tuple[int, ...],
        data: Tensor | None = None,
        shm: ShmRef | None = None,
    ) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.data = data
        self.shm = shm


def with_input_parameters(
    parameters: dict[str, Any], per_input: list[tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    """``parameters`` with each input's own (transport ones left out) under
    :data:`INPUT_PARAMETERS`; unchanged when no input carries any."""
    kept = {
        name: meaning
        for name, params in per_input
        if (meaning := {k: v for k, v in params.items() if k not in INPUT_TRANSPORT_PARAMETERS})
    }
    return {**parameters, INPUT_PARAMETERS: kept} if kept else parameters


@dataclass(slots=True, init=False)
class RequestedOutput:
    """One requested output; ``binary`` None means the request's default."""

    name: str
    binary: bool | None
    shm: ShmRef | None

    def __init__(self, name: str, binary: bool | None = None, shm: ShmRef | None = None) -> None:
        self.name = name
        self.binary = binary
        self.shm = shm


@dataclass(slots=True, init=False)
class InferRequest:
    """A decoded inference request."""

    model: str
    version: str
    id: str
    parameters: dict[str, Any]
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None
    binary_output: bool

    def __init__(
        self,
        model: str,
        version: str,
        id: str,
        parameters: dict[str, Any],
        inputs: list[InputTensor],
        outputs: list[RequestedOutput] | None,
        binary_output: bool = False,
    ) -> None:
        self.model = model
        self.version = version
        self.id = id
        self.parameters = parameters
        self.inputs = inputs
        self.outputs = outputs
        self.binary_output = binary_output

    def model_parameters(self) -> dict[str, Any]:
        """Return the parameters the model sees (transport ones removed)."""
        return {k: v for k, v in self.parameters.items() if k not in TRANSPORT_PARAMETERS}

    def timeout_s(self) -> float | None:
        """Return the KServe ``timeout`` parameter (microseconds) in seconds."""
        value = self.parameters.get("timeout")
        if value is None or isinstance(value, bool):
            return None
        if not isinstance(value, int | float) or value < 0:
            raise DecodeError(f"parameter timeout must be microseconds >= 0, got {value!r}")
        return value / 1e6 if value else None


@dataclass(slots=True, init=False)
class OutputData:
    """One output of a finished inference, ready to encode.

    ``tensor`` is a view into shared memory, valid only while the result
    that produced it is held. For an output written into a client's region
    (``shm`` set), only its name, datatype, shape and parameters are sent back.
    """

    name: str
    tensor: Tensor
    binary: bool
    shm: ShmRef | None
    # What the model said of this output (core/output_parameters.py): the
    # response's "parameters" of it, beside the protocol's own.
    parameters: Mapping[str, Any] | None

    def __init__(
        self,
        name: str,
        tensor: Tensor,
        binary: bool,
        shm: ShmRef | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.tensor = tensor
        self.binary = binary
        self.shm = shm
        self.parameters = parameters


def parse_dtype(name: object, what: str) -> DType:
    """Parse a KServe datatype name.

    Raises:
        DecodeError: not a datatype the appliance handles.
    """
    try:
        return dtypes.parse_dtype(name)
    except ValueError as ex:
        raise DecodeError(f"{what}: {ex}") from None


def parse_shape(shape: object, what: str) -> tuple[int, ...]:
    """Parse a shape: a list of non-negative integers.

    Raises:
        DecodeError: not a list of non-negative integers.
    """
    if not isinstance(shape, list | tuple) or len(shape) > MAX_RANK:
        raise DecodeError(f"{what}: shape must be a list of at most {MAX_RANK} integers")
    dims = []
    claimed = 1
    for dim in shape:
        if type(dim) is not int:  # PERF: the common case, one check (bool is not int here)
            if isinstance(dim, bool) or not isinstance(dim, int):
                raise DecodeError(f"{what}: shape {list(shape)} must hold integers >= 0")
            dim = int(dim)
        if dim < 0:
            raise DecodeError(f"{what}: shape {list(shape)} must hold integers >= 0")
        dims.append(dim)
        if dim > 1:
            claimed *= dim
    if claimed > MAX_ELEMENTS:
        raise DecodeError(
            f"{what}: shape {dims} claims more than {MAX_ELEMENTS} elements "
            "(zero dims aside), more than any tensor can hold"
        )
    return tuple(dims)


def tensor_from_buffer(
    name: str, dtype: DType, shape: tuple[int, ...], buffer: memoryview | bytes
) -> Tensor:
    """Wrap raw tensor bytes (row-major, little-endian; BYTES packed) without copying.

    Raises:
        DecodeError: the byte size does not match the shape and datatype.
    """
    size = len(buffer) if isinstance(buffer, bytes) else buffer.nbytes
    if dtype is DType.BYTES:
        # The model worker unpacks it and checks the element count; refuse
        # here what cannot fit (each element has a 4-byte length), before a
        # huge claimed count reaches it.
        count = dtypes.element_count(shape)
        if count * 4 > size:
            raise DecodeError(
                f"input {name}: shape {list(shape)} of BYTES needs at least {count * 4} bytes "
                f"(a 4-byte length per element), got {size}"
            )
        return Tensor(dtype, shape, buffer)
    check_byte_size(name, dtype, shape, size)
    array = np.frombuffer(buffer, dtype=dtypes.to_numpy(dtype)).reshape(shape)
    return Tensor(dtype, shape, array)


def check_byte_size(name: str, dtype: DType, shape: tuple[int, ...], size: int) -> None:
    """Refuse ``size`` bytes of a numeric tensor that its shape and datatype do not fill.

    Raises:
        DecodeError: they do not.
    """
    expected = dtypes.element_count(shape) * dtypes.item_size(dtype)
    if size != expected:
        raise DecodeError(
            f"input {name}: {size} bytes of data do not match shape {list(shape)} of "
            f"{dtype.value} ({expected} bytes expected)"
        )


def shm_ref(parameters: Mapping[str, Any], what: str) -> ShmRef | None:
    """Read the shared-memory parameters of a tensor, if it has them.

    SPEC: PROTOCOL-FACTS §2.4 — shared_memory_region and
    shared_memory_byte_size go together; shared_memory_offset defaults to 0.

    Raises:
        DecodeError: only one of region and byte size, or bad values.
    """
    region = parameters.get("shared_memory_region")
    size = parameters.get("shared_memory_byte_size")
    if region is None and size is None:
        return None
    if region is None or size is None:
        raise DecodeError(
            f"{what}: shared_memory_region and shared_memory_byte_size must be given together"
        )
    offset = parameters.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not region:
        raise DecodeError(f"{what}: shared_memory_region must be a region name")
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DecodeError(f"{what}: {key} must be an integer >= 0, got {value!r}")
    return ShmRef(region, int(size), int(offset))


def check_unique(names: list[str], what: str) -> None:
    """Raise DecodeError if a tensor name repeats."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DecodeError(f"{what} {name!r} is given more than once")
        seen.add(name)
