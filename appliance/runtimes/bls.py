"""Calls from a Triton Python-backend model to the other models the appliance serves (BLS).

``pb_utils.InferenceRequest(model_name=..., inputs=[...]).exec()`` (and
``await ...async_exec()``, and ``exec(decoupled=True)`` for a streaming
model) go through the model worker's own :class:`ModelClient`, the client
every protocol uses: the request's tensors are written once into the
worker's request ring, the called model (any model: Python, ONNX,
TorchScript, another Python-backend model, an ensemble) reads them in
place, and its outputs are copied out of its response ring into the
response, as Triton's stub copies them, so the called model's ring is free
again as soon as the call returns.

The client, and its ring, are made at the first call: a model that calls no
other model costs nothing. The model worker names its tree with
:func:`attach` before it loads the model, and :func:`close` unlinks the ring
when it stops. Errors come back as the response's error
(``response.has_error()``, ``error().message()``, Triton's error codes),
never as an exception.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from appliance.core.sequences import (
    FLAG_END,
    FLAG_START,
    SEQUENCE_END,
    SEQUENCE_ID,
    SEQUENCE_START,
)
from appliance.errors import (
    ApplianceError,
    BadRequest,
    ControlError,
    ErrorCode,
    ModelNotFound,
    ModelNotReady,
)
from appliance.runtimes.pb_types import InferenceResponse, Tensor, TritonError

if TYPE_CHECKING:
    from appliance.client.api import ModelClient
    from appliance.config.settings import ApplianceConfig
    from appliance.core.status import StatusTable
    from appliance.core.tree import Tree

# The request ring of a model worker's calls: calls carry a model's own
# tensors, seldom large (larger ones go to one-off segments).
RING_BYTES = 8 << 20
# Loading imports the model and its runtime (torch alone takes seconds).
LOAD_TIMEOUT_S = 300.0


class CallRequest(Protocol):
    """What a call reads of the request a model made (``pb_utils.InferenceRequest``).

    Described here, not imported: python_backend_utils.py, which defines the
    request, calls this module.
    """

    def model_name(self) -> str: ...

    def inputs(self) -> Iterable[Tensor]: ...

    def requested_output_names(self) -> Sequence[str]: ...

    def parameters(self) -> str: ...

    def timeout(self) -> int: ...

    def correlation_id(self) -> int | str: ...

    def flags(self) -> int: ...

    def request_id(self) -> str: ...


_where: tuple[Tree, ApplianceConfig, StatusTable] | None = None
_client: ModelClient | None = None
_lock = threading.Lock()


def attach(tree: Tree, config: ApplianceConfig, status: StatusTable) -> None:
    """Say which tree this process's calls go to (the model worker's, before its load)."""
    global _where
    _where = (tree, config, status)


def close() -> None:
    """Close the client, if a call made one (its ring is unlinked)."""
    global _client
    with _lock:
        client, _client = _client, None
    if client is not None:
        client.close()


def infer(request: CallRequest) -> InferenceResponse:
    """Run ``request`` on its model; its outputs, or its error, as a response."""
    try:
        with _the_client().infer(**_call(request)) as result:
            return _response(result.outputs)
    except ApplianceError as ex:
        return _failed(ex)


async def infer_async(request: CallRequest) -> InferenceResponse:
    """:func:`infer`, awaited in the running event loop (``async def execute``)."""
    try:
        result = await _the_client().infer_async(**_call(request))
    except ApplianceError as ex:
        return _failed(ex)
    with result:
        return _response(result.outputs)


def stream(request: CallRequest) -> Iterator[InferenceResponse]:
    """A decoupled model's responses to ``request``, then the empty final one.

    An error ends the responses with a response carrying it.
    """
    try:
        parts = _the_client().stream(**_call(request))
        try:
            for part in parts:
                with part:
                    yield _response(part.outputs)
        finally:
            parts.close()  # type: ignore[attr-defined]  # a generator: cancels the stream
    except ApplianceError as ex:
        yield _failed(ex)
        return
    yield _response({})


async def stream_async(
    request: CallRequest,
) -> AsyncIterator[InferenceResponse]:
    """:func:`stream`, awaited in the running event loop."""
    try:
        async with contextlib.aclosing(_the_client().stream_async(**_call(request))) as parts:
            async for part in parts:
                with part:
                    yield _response(part.outputs)
    except ApplianceError as ex:
        yield _failed(ex)
        return
    yield _response({})


def load_model(model: str, config: str, files: Mapping[str, bytes] | None) -> None:
    """Triton's ``pb_utils.load_model``: (re)load ``model``, with ``config`` (Triton's
    model-config JSON) over its own and ``files`` (``"file:<path>"`` -> bytes) as its
    files; return once it serves.

    Raises:
        ApplianceError: it was refused or did not become ready; the message says why.
    """
    from appliance.client import override  # the config's reader: only for a load

    shipped = {path.removeprefix("file:"): bytes(data) for path, data in (files or {}).items()}
    if shipped and not config:
        raise BadRequest(
            f"failed to load '{model}': model files need the model's config beside them"
        )
    overrides = override.parse(model, config, shipped) if config else {}
    try:
        _the_client().load_model(model, LOAD_TIMEOUT_S, overrides, shipped or None)
    except ControlError as ex:
        raise ModelNotReady(f"failed to load '{model}': {ex}") from None


def unload_model(model: str) -> None:
    """Triton's ``pb_utils.unload_model``: stop serving ``model``.

    Raises:
        ApplianceError: it is not served, or a reload is running.
    """
    try:
        _the_client().unload_model(model)
    except ControlError as ex:
        raise ModelNotFound(f"failed to unload '{model}': {ex}") from None


def is_model_ready(model: str, version: str) -> bool:
    """Triton's ``pb_utils.is_model_ready``: whether ``model`` (that version, when
    given) serves now."""
    client = _the_client()
    if not client.model_ready(model):  # False for a model it does not serve
        return False
    return not version or version in client.metadata(model).versions


def _the_client() -> ModelClient:
    global _client
    with _lock:
        if _client is None:
            if _where is None:
                raise ApplianceError(
                    "InferenceRequest.exec: this process serves no model, so it has no "
                    "appliance to call"
                )
            from appliance.client.api import ModelClient

            tree, config, status = _where
            _client = ModelClient(tree, config, status, ring_bytes=RING_BYTES)
        return _client


def _call(request: CallRequest) -> dict[str, Any]:
    """The client's arguments for ``request``."""
    timeout_us = request.timeout()
    parameters = json.loads(request.parameters())
    sequence = request.correlation_id()
    if sequence:
        # A step of a sequence model's sequence, as a client's request says it.
        flags = request.flags()
        parameters[SEQUENCE_ID] = sequence
        parameters[SEQUENCE_START] = bool(flags & FLAG_START)
        parameters[SEQUENCE_END] = bool(flags & FLAG_END)
    return {
        "model": request.model_name(),
        "inputs": {tensor.name(): tensor.as_numpy() for tensor in request.inputs()},
        "outputs": request.requested_output_names() or None,
        "parameters": parameters,
        "timeout_s": timeout_us / 1e6 if timeout_us > 0 else None,
        "request_id": request.request_id(),
    }


def _response(outputs: dict[str, Any]) -> InferenceResponse:
    # Copied: the views are of the called model's ring, which it reuses.
    tensors = [Tensor(name, np.array(t.array())) for name, t in outputs.items()]
    return InferenceResponse(output_tensors=tensors)


def _failed(ex: ApplianceError) -> InferenceResponse:
    code = _CODES.get(ex.code, TritonError.INTERNAL)
    return InferenceResponse(error=TritonError(ex.message, code))


_CODES = {
    ErrorCode.BAD_REQUEST: TritonError.INVALID_ARG,
    ErrorCode.MODEL_NOT_FOUND: TritonError.NOT_FOUND,
    ErrorCode.MODEL_NOT_READY: TritonError.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: TritonError.UNSUPPORTED,
}
