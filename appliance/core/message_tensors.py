"""Tensors in descriptors: placed into a message's body and read back out of it.

Each tensor of a body is ``[name, dtype, shape, place]`` (see
:mod:`appliance.core.descriptor` for the format): its bytes inline in the
message, in a shared-memory segment of the tree, or in a client's GPU
memory. :func:`place_tensors` writes the entries (copying bytes into a ring
or inline), :func:`read_tensors` turns them back into tensors, viewing the
segments through a :class:`SegmentReader`; the block helpers carry which
ring blocks a reply leases. An inline payload may be a view of a ring: see
the descriptor module's SAFETY note on how it is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from appliance.core.client_memory import ClientTensor
from appliance.core.descriptor import DescriptorError
from appliance.core.device_tensors import CudaPlace, DeviceTensor, empty_like, is_cuda_place
from appliance.core.dtypes import DType, to_numpy
from appliance.core.output_parameters import parameters_of
from appliance.core.ring import Block
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest

# PERF: a dtype's name by lookup; an enum's .value costs ten times as much.
_NAMES = {dtype: dtype.value for dtype in DType}
# Inline tensors up to this size are copied out whole (a copy costs less than a view here).
SMALL = 1024


@dataclass(frozen=True, slots=True)
class Placed:
    """A tensor whose bytes already lie in shared memory: sent as a reference, never copied.

    The sender keeps ``block`` alive (and unchanged) until the receiver has answered.
    """

    dtype: DType
    shape: tuple[int, ...]
    block: Block


class Allocator(Protocol):
    """Where tensor bytes go: a :class:`~appliance.core.ring.Ring` or a wrapper."""

    def alloc(self, nbytes: int) -> Block: ...

    def view(self, block: Block) -> memoryview: ...


def place_tensors(
    tensors: Mapping[str, Tensor | DeviceTensor | ClientTensor | Placed],
    ring: Allocator,
    inline_threshold: int,
    payloads: list[Any],
    blocks: list[Block],
) -> list[list[Any]]:
    """Write tensors into a message: small ones inline, the rest into ``ring``.

    Outputs a model gave parameters (an OutputsWithParameters) carry them
    in their entries. Appends inline payloads to ``payloads`` and the ring blocks used to
    ``blocks`` (the caller releases them when the peer is done). A tensor in
    a client's file is read straight into its block (or payload): its one copy.

    Raises:
        TooLarge, Overloaded: from the ring.
        BadRequest: a client's file shrank, vanished or was replaced.
    """
    entries: list[list[Any]] = []
    for name, tensor in tensors.items():
        if type(tensor) is DeviceTensor:
            entries.append([name, _NAMES[tensor.dtype], list(tensor.shape), tensor.place.to_body()])
            continue
        if type(tensor) is ClientTensor:
            entries.append(_place_client(name, tensor, ring, inline_threshold, payloads, blocks))
            continue
        if type(tensor) is Placed:
            where = tensor.block
            at = [where.segment, where.offset, where.nbytes]
            entries.append([name, _NAMES[tensor.dtype], list(tensor.shape), at])
            continue
        assert isinstance(tensor, Tensor)
        dtype = tensor.dtype
        place: Any
        if dtype is not DType.BYTES and tensor.array().nbytes <= min(inline_threshold, SMALL):
            # PERF: a small array's bytes in one call, rather than a flat byte view of it.
            place = len(payloads)
            payloads.append(tensor.array().tobytes())
        else:
            raw = tensor.raw()
            nbytes = raw.nbytes
            if nbytes <= inline_threshold:
                place = len(payloads)
                payloads.append(raw)
            else:
                block = ring.alloc(nbytes)
                blocks.append(block)
                ring.view(block)[:] = raw
                place = [block.segment, block.offset, block.nbytes]
        entries.append([name, _NAMES[dtype], list(tensor.shape), place])
    return add_parameters(entries, tensors)


def add_parameters(entries: list[list[Any]], outputs: object) -> list[list[Any]]:
    """``entries``, each of an output ``outputs`` gave parameters (an OutputsWithParameters)
    with them fifth; a plain mapping adds none."""
    described = None if type(outputs) is dict else parameters_of(outputs)
    if described:
        for entry in entries:
            if entry[0] in described:
                entry.append(described[entry[0]])
    return entries


def _place_client(
    name: str,
    tensor: ClientTensor,
    ring: Allocator,
    inline_threshold: int,
    payloads: list[Any],
    blocks: list[Block],
) -> list[Any]:
    """:func:`place_tensors` for a tensor in a client's file."""
    span = tensor.span
    place: Any
    if span.nbytes <= inline_threshold:
        place = len(payloads)
        payloads.append(span.read())
    else:
        block = ring.alloc(span.nbytes)
        blocks.append(block)
        span.read_into(ring.view(block))
        place = [block.segment, block.offset, block.nbytes]
    return [name, tensor.dtype.value, list(tensor.shape), place]


class Views(Protocol):
    """What reading tensors needs of a :class:`SegmentReader`: a view of a segment's bytes."""

    def view(self, segment: str, offset: int, nbytes: int) -> memoryview: ...


class SegmentReader:
    """Read tensors out of other processes' segments, mapping each once.

    Args:
        attach: maps a segment by name (read-only); raising
            FileNotFoundError if it is gone.
        keep: which segments stay mapped for later reads (all by default);
            the mapping of any other lives as long as the views of it.
    """

    def __init__(self, attach: Any, keep: Callable[[str], bool] | None = None) -> None:
        self._attach = attach
        self._keep = keep
        self._segments: dict[str, Any] = {}
        self._bases: dict[str, int] = {}

    def view(self, segment: str, offset: int, nbytes: int) -> memoryview:
        mapped = self._segments.get(segment)
        if mapped is None:
            mapped = self._attach(segment)
            if self._keep is None or self._keep(segment):
                self._segments[segment] = mapped
                first = np.frombuffer(mapped.buffer, dtype=np.uint8, count=min(1, mapped.size))
                self._bases[segment] = int(first.__array_interface__["data"][0])
        if offset < 0 or nbytes < 0 or offset + nbytes > mapped.size:
            raise DescriptorError(
                f"block [{offset}, {offset + nbytes}) lies outside segment {segment}"
            )
        return memoryview(mapped.buffer)[offset : offset + nbytes]

    def base(self, segment: str) -> int:
        """The address of a mapped segment's first byte in this process."""
        return self._bases[segment]

    def forget(self, segment: str) -> bool:
        """Unmap one segment; return False if views of it are still alive."""
        mapped = self._segments.get(segment)
        if mapped is None:
            return True
        if mapped.close():
            del self._segments[segment]
            del self._bases[segment]
            return True
        return False

    def names(self) -> list[str]:
        return list(self._segments)

    def close(self) -> None:
        for name in list(self._segments):
            self.forget(name)


_DTYPES = {dtype.value: dtype for dtype in DType}


def read_tensors(
    entries: Iterable[Sequence[Any]], payloads: Sequence[Any], reader: Views
) -> dict[str, Tensor]:
    """Rebuild tensors from body entries; ring data is viewed, not copied.

    A tensor in a client's GPU memory comes as a placeholder of its shape
    and dtype that holds no bytes: the model worker puts the data in its
    place (appliance/worker/cuda_regions.py), and a reply's output that the
    worker wrote into the client's region needs none.

    Raises:
        BadRequest: an entry is malformed or its bytes do not fit its shape.
    """
    tensors: dict[str, Tensor] = {}
    for entry in entries:
        try:
            # A reply's output may carry its parameters fifth (see place_tensors).
            name, dtype_name, shape, place = entry if len(entry) == 4 else entry[:4]
            dtype = _DTYPES[dtype_name]
            if type(place) is int:
                if place < 0:
                    raise IndexError(f"inline payload {place} does not exist")
                data: Any = payloads[place]
            elif is_cuda_place(place):
                tensors[str(name)] = _placeholder(dtype, shape, place)
                continue
            else:
                data = reader.view(str(place[0]), int(place[1]), int(place[2]))
            tensors[str(name)] = _tensor(dtype, shape, data)
        except (ValueError, TypeError, IndexError, KeyError, FileNotFoundError) as ex:
            raise BadRequest(f"tensor descriptor {entry!r:.120} is invalid: {ex}") from None
    return tensors


def _placeholder(dtype: DType, shape: Sequence[int], place: Any) -> Tensor:
    _check_shape(shape)
    if dtype is DType.BYTES:
        raise ValueError("BYTES tensors cannot lie in GPU memory")
    CudaPlace.from_body(place)  # raises ValueError for a malformed place
    return Tensor(dtype, tuple(shape), empty_like(shape, dtype))


def _check_shape(shape: Sequence[int]) -> None:
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise ValueError(f"shape {shape!r} must hold integers >= 0")


def _tensor(dtype: DType, shape: Sequence[int], data: Any) -> Tensor:
    _check_shape(shape)
    if dtype is DType.BYTES:
        return Tensor(dtype, shape, memoryview(data).cast("B"))
    array = np.frombuffer(data, dtype=to_numpy(dtype)).reshape(shape)
    return Tensor(dtype, array.shape, array)


def block_list(blocks: Iterable[Block]) -> list[list[Any]]:
    return [[block.segment, block.offset, block.nbytes] for block in blocks]


def blocks_from(entries: Iterable[Sequence[Any]]) -> list[Block]:
    """Parse ``[[segment, offset, nbytes], ...]``; malformed entries are skipped."""
    blocks = []
    for entry in entries:
        try:
            blocks.append(Block(str(entry[0]), int(entry[1]), int(entry[2])))
        except (TypeError, ValueError, IndexError):
            continue
    return blocks


def ring_blocks(
    entries: Iterable[Sequence[Any]], borrowed: Sequence[str] | None = None
) -> list[Block]:
    """Return the ring blocks (not inline payloads, not GPU places) named by tensor entries.

    ``borrowed``: names of entries to leave out (a reply's pass-through outputs).
    """
    places = [
        entry[3]
        for entry in entries
        if type(entry[3]) is list and not (borrowed and entry[0] in borrowed)
    ]
    return blocks_from(places) if places else []


def leased_blocks(body: Mapping[str, Any]) -> list[Block]:
    """The blocks a reply's worker leased to its client: its ring blocks less the borrowed."""
    return ring_blocks(body.get("tensors", ()), body.get("borrowed"))
