"""What the KServe endpoints answer about the server and its models, whichever transport asked.

``rest`` and ``grpc`` decode their wire form, call these functions and
encode what they return. The dicts returned here are the REST bodies as the
Triton docs show them; ``grpc`` parses them into the protobuf messages, so
both transports answer the same thing. Here: the server's metadata and
trace settings, which served model answers for a version, readiness and
model metadata. The rest of the service is beside it: inference in
``infer``, the model configuration in ``model_configuration``, statistics
in ``statistics``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import appliance
from appliance.client.api import ModelClient
from appliance.core import cuda
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import TensorSpec
from appliance.errors import ApplianceError, BadRequest, ModelNotFound

# SPEC: PROTOCOL-FACTS §2.7 — Triton's simple_*_health_metadata examples
# require the server name "triton"; the version says what is really serving.
SERVER_NAME = "triton"
SERVER_VERSION = f"appliance-{appliance.__version__}"
# Exactly the extensions this package implements (PROTOCOL-FACTS §2.3-2.6).
EXTENSIONS = (
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_configuration",
    "system_shared_memory",
    "model_repository",
    "trace",
)
# Advertised only where a CUDA driver is installed (shm.py, cuda.py).
CUDA_EXTENSION = "cuda_shared_memory"


def server_metadata() -> dict[str, Any]:
    extensions = [*EXTENSIONS, CUDA_EXTENSION] if cuda.installed() else list(EXTENSIONS)
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": extensions}


def served_name(client: ModelClient, model: str, version: str) -> str:
    """Return the served model that answers for ``version`` of ``model``.

    A model repository serves a model's newest version under its name and
    older ones as ``<name>.v<N>`` (repository.py); Triton clients ask for
    those as ``/v2/models/<name>/versions/<N>``.
    """
    if version:
        older = f"{model}.v{version}"
        if older in client.models():
            return older
    return model


def all_versions(client: ModelClient, model: str, newest: Sequence[str]) -> list[str]:
    """The versions served for ``model``: its own and its ``.v<N>`` siblings'."""
    prefix = f"{model}.v"
    older = [name[len(prefix) :] for name in client.models() if name.startswith(prefix)]
    return sorted({*older, *newest}, key=lambda v: (len(v), v))


def resolve(client: ModelClient, model: str, version: str) -> tuple[str, ModelMetadata]:
    """Return the served model answering for ``version`` of ``model``, and its metadata.

    Raises:
        BadRequest: ``version`` is not a number.
        ModelNotFound: no such model, or no such version of it.
        ModelNotReady: the model has not loaded yet.
    """
    served = served_name(client, model, version)
    if version and not version.isdecimal() and not _serves_version(client, served, version):
        # Triton's own wording: its example clients look for it. (A version of
        # an MLServer folder's model may be text, "v0.1.0": that one is served.)
        raise BadRequest(f"failed to get model version from specified version string '{version}'")
    metadata = client.metadata(served)
    if version and version not in metadata.versions:
        versions = all_versions(client, model, metadata.versions)
        raise ModelNotFound(
            f"Request for unknown model: '{model}' version {version} is not found; "
            f"it has version(s) {', '.join(versions) or 'none'}"
        )
    return served, metadata


def _serves_version(client: ModelClient, served: str, version: str) -> bool:
    try:
        return version in client.metadata(served).versions
    except ApplianceError:
        return False


def version_of(client: ModelClient, model: str) -> str:
    """Return the version a model serves, "" while it is not loaded."""
    try:
        versions = client.metadata(model).versions
    except ApplianceError:
        return ""
    return versions[-1] if versions else ""


def model_ready(client: ModelClient, model: str, version: str) -> bool:
    """Online, the model has a ready instance, and serves that version."""
    if model not in client.models() or not client.status.online:
        return False
    try:
        served, _ = resolve(client, model, version)
    except ApplianceError:
        return False
    return client.model_ready(served)


def model_metadata(client: ModelClient, model: str, version: str) -> dict[str, Any]:
    """The model's KServe metadata: its declared tensors, or for a model that takes
    any tensors, those it lists (Model.listed_metadata: MLServer's settings' tensors,
    with their parameters) and its model-level parameters."""
    _, metadata = resolve(client, model, version)
    versions = [version] if version else all_versions(client, model, metadata.versions)
    listed = metadata.listed
    found: dict[str, Any] = {
        "name": model,
        "versions": versions,
        "platform": metadata.platform,
        "inputs": _tensor_metadata(metadata.inputs, listed.get("inputs")),
        "outputs": _tensor_metadata(metadata.outputs, listed.get("outputs")),
    }
    if isinstance(listed.get("parameters"), dict):
        found["parameters"] = listed["parameters"]
    return found


def _tensor_metadata(declared: Sequence[TensorSpec] | None, listed: Any) -> list[dict[str, Any]]:
    if declared is None and isinstance(listed, list):
        return [dict(item) for item in listed if isinstance(item, dict)]
    return [spec.to_dict() for spec in declared or ()]
