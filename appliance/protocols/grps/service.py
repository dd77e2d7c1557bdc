"""What the GRPS endpoints do, whichever transport asked.

``rest`` and ``grpc`` decode their wire form into a :class:`Payload`, call
these functions, and encode what comes back with their own codec (passed
in as ``encode``, because model outputs are views into shared memory that
must be encoded before the result is released).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any, TypeVar

import yaml

import appliance
from appliance.client.api import ModelClient
from appliance.core.tensor import TensorSpec
from appliance.errors import ApplianceError, ControlError
from appliance.protocols.grps.bind import ReplyShaper, bind
from appliance.protocols.grps.errors import GrpsError, bad_request, from_appliance
from appliance.protocols.grps.payload import Payload, output_type

log = logging.getLogger("appliance.grps")

T = TypeVar("T")
Encode = Callable[[Payload], T]

# SPEC: PROTOCOL-FACTS §3.2 — GRPS's readiness failure message.
UNAVAILABLE = "Service Unavailable"


def resolve_model(client: ModelClient, requested: str) -> str:
    """Return the model a request names: "name", "name-version" or "" (default).

    SPEC: grps.md "模型选择" — models are selected as ``name-version``.

    Raises:
        GrpsError: 404 unknown model or version; 400 no model and no default.
    """
    models = client.models()
    if not requested:
        default = client.config.server.default_model
        if not default:
            raise bad_request(
                "the request names no model and no server.default_model is configured; "
                f"set model to one of: {', '.join(models)}"
            )
        return default
    if requested in models:
        return requested
    base, dash, version = requested.rpartition("-")
    if dash and base in models:
        versions = client.metadata(base).versions
        if version in versions:
            return base
        raise GrpsError(
            404, f"model {base} has version {', '.join(versions)}, not {version!r} ({requested})"
        )
    raise GrpsError(
        404,
        f"Request for unknown model: '{requested}' is not found; "
        f"served models (name or name-version): {', '.join(models)}",
    )


async def predict_async(
    client: ModelClient,
    payload: Payload,
    parameters: dict[str, Any],
    encode: Encode[T],
    want_ndarray: bool = False,
    timeout_s: float | None = None,
) -> T:
    """Run the model once; return the encoded reply (the call waits in the loop)."""
    model, inputs, shaper = _prepare(client, payload, want_ndarray)
    result = await client.infer_async(model, inputs, parameters=parameters, timeout_s=timeout_s)
    with result:
        return encode(shaper.shape(result.outputs))


def _prepare(
    client: ModelClient, payload: Payload, want_ndarray: bool
) -> tuple[str, dict[str, Any], ReplyShaper]:
    model = resolve_model(client, payload.model)
    inputs = bind(payload, client.metadata(model))
    return model, inputs, ReplyShaper(payload, want_ndarray)


async def stream_async(
    client: ModelClient,
    payload: Payload,
    parameters: dict[str, Any],
    encode: Encode[T],
    timeout_s: float | None = None,
) -> AsyncGenerator[T, None]:
    """Yield the encoded replies as the model streams them (in the event loop).

    A model without a streaming predict answers once. Closing this
    generator early (``aclose``) cancels the model's stream in the worker.
    """
    model = resolve_model(client, payload.model)
    metadata = client.metadata(model)
    inputs = bind(payload, metadata)
    shaper = ReplyShaper(payload)
    if not metadata.supports.get("predict_stream"):
        result = await client.infer_async(model, inputs, parameters=parameters, timeout_s=timeout_s)
        with result:
            yield encode(shaper.shape(result.outputs))
        return
    stream = client.stream_async(model, inputs, parameters=parameters, timeout_s=timeout_s)
    async with contextlib.aclosing(stream) as parts:
        async for part in parts:
            yield encode(shaper.shape(part.outputs, final=False))
        shaper.finish()


def failure(error: BaseException) -> GrpsError:
    """Return the GRPS failure for any exception; log the unexpected ones."""
    if isinstance(error, GrpsError):
        return error
    if isinstance(error, ApplianceError):
        return from_appliance(error)
    log.error("GRPS request failed", exc_info=error)
    return GrpsError(500, f"internal error: {type(error).__name__}; see the appliance log")


def parameters(pairs: Iterable[tuple[str, str]], reserved: Iterable[str]) -> dict[str, Any]:
    """Return request options (query or metadata pairs) as model parameters.

    Numbers and true/false become numbers and booleans, so a model such as
    ``echo`` gets ``chunks=3`` as 3.
    """
    skip = set(reserved)
    return {key: _scalar(value) for key, value in pairs if key not in skip}


def _scalar(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        number = int(text)
    except ValueError:
        pass
    else:
        # A descriptor carries integers of 64 bits; a longer one stays the text sent.
        return number if -(1 << 63) <= number < 1 << 64 else text
    try:
        return float(text)
    except ValueError:
        return text


# -- health --------------------------------------------------------------------


def set_online(client: ModelClient, online: bool) -> None:
    """Flip the host's one online flag (every protocol's readiness).

    Raises:
        GrpsError: 503, the master cannot be reached.
    """
    try:
        client.set_online(online)
    except (ControlError, OSError) as ex:
        raise GrpsError(
            503, f"cannot reach the appliance master to go online/offline: {ex}"
        ) from None


def ready(client: ModelClient) -> bool:
    return client.server_ready()


# -- metadata ------------------------------------------------------------------


def server_metadata(client: ModelClient) -> str:
    """Return the server's description as YAML (GRPS puts it in str_data)."""
    server = client.config.server
    doc = {
        "server": {
            "name": "appliance",
            "version": appliance.__version__,
            "interfaces": ["http: /grps/v1", "grpc: grps.protos.v1.GrpsService"],
            "default_model": server.default_model,
            "online": client.status.online,
            "ready": client.server_ready(),
        },
        "models": [_model_entry(client, name) for name in client.models()],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def model_metadata(client: ModelClient, requested: str) -> str:
    """Return one model's description as YAML.

    Raises:
        GrpsError: 400 no name; 404 unknown model.
    """
    if not requested:
        raise bad_request("No model name: send the model's name in str_data")
    return yaml.safe_dump(_model_entry(client, resolve_model(client, requested)), sort_keys=False)


def _model_entry(client: ModelClient, name: str) -> dict[str, Any]:
    config = client.config.model(name)
    entry: dict[str, Any] = {"name": name}
    if config is not None:
        entry.update({"class": config.cls, "instances": config.instances})
    entry["ready"] = client.model_ready(name)
    try:
        metadata = client.metadata(name)
    except ApplianceError:
        return entry  # not loaded yet: what the config says is all there is
    entry.update(
        {
            "version": ",".join(metadata.versions),
            "platform": metadata.platform,
            "max_batch_size": metadata.max_batch_size,
            "streaming": bool(metadata.supports.get("predict_stream")),
            "inputs": _specs(metadata.inputs),
            "outputs": _specs(metadata.outputs),
        }
    )
    if metadata.description:
        entry["description"] = metadata.description
    return entry


def _specs(specs: tuple[TensorSpec, ...] | None) -> list[dict[str, Any]] | str:
    if specs is None:
        return "any named tensors"
    return [
        {
            "name": spec.name,
            "dtype": output_type(spec.dtype).name,
            "datatype": spec.dtype.value,
            "shape": list(spec.shape),
        }
        for spec in specs
    ]
