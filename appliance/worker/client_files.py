"""Outputs a model worker writes straight into a client's file (KServe system shared memory).

A frontend that would copy an output from the worker's response ring into
the client's registered segment hands the worker the segment's place
instead (a :class:`~appliance.core.client_memory.ClientSpan`, under the
request's ``"targets"`` beside any CUDA places): the worker writes the
output there, and the reply carries a place without bytes (``WRITTEN``).
One copy of every such output fewer, and not on the frontend's event loop.

The write is the span's own (``pwritev`` on a descriptor opened for it,
the file's identity and size checked): the worker maps no client file and
holds nothing once the reply is made, so a region unregistered is let go
of by every process at once. BYTES outputs are left to the frontend, whose
reply then carries them (a placeholder holds no BYTES).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.core.client_memory import WRITTEN, ClientSpan, is_file_place
from appliance.core.dtypes import DType
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest


def file_targets(raw: Any, declared: frozenset[str] | None) -> dict[str, ClientSpan] | None:
    """The places in clients' files among a request's targets; None when it has none.

    ``declared``: the model's output names, None when it declares none.

    Raises:
        BadRequest: a place is malformed, or names an output the model lacks.
    """
    if type(raw) is not dict:
        raise BadRequest("a request's targets must map output names to places")
    files = None
    for name, place in raw.items():
        if not is_file_place(place):
            continue
        if declared is not None and name not in declared:
            raise BadRequest(
                f"the model has no output named {name!r}; its outputs are "
                f"{', '.join(sorted(declared))}"
            )
        try:
            span = ClientSpan.from_body(place)
        except ValueError as ex:
            raise BadRequest(f"bad shared memory place: {ex}") from None
        if files is None:
            files = {}
        files[str(name)] = span
    return files


def write_files(
    files: Mapping[str, ClientSpan], outputs: Mapping[str, Tensor]
) -> dict[str, list[Any]]:
    """Write the outputs bound for clients' files; return their reply entries.

    Raises:
        BadRequest: an output is larger than its place, or the file is gone,
            replaced or shrank.
    """
    entries = {}
    for name, span in files.items():
        tensor = outputs.get(name)
        if tensor is None or tensor.dtype is DType.BYTES:
            continue
        raw = tensor.raw()
        if raw.nbytes > span.nbytes:
            raise BadRequest(
                f"{span.what} needs {raw.nbytes} bytes but its shared_memory_byte_size "
                f"is {span.nbytes} ({span.label})"
            )
        span.write(raw)
        entries[name] = [name, tensor.dtype.value, list(tensor.shape), WRITTEN]
    return entries
