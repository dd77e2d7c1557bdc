"""TorchServe's error form: ``{"code", "type", "message"}``, pretty JSON, and its statuses.

TorchServe's frontend answers every failure with the status as ``code``, the
Java exception's simple name as ``type`` and its message, printed by Gson
with an indent of 2 and a newline. A handler's failure is an
``InternalServerException`` with the status the worker gave it (503, or a
``PredictionException``'s own code); the appliance's own refusals take the
names TorchServe gives the same cases.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from appliance.errors import (
    ApplianceError,
    BadRequest,
    DeadlineExceeded,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    TooLarge,
    Unsupported,
)

log = logging.getLogger("appliance.torchserve")


class TorchServeError(Exception):
    """An error answered in TorchServe's form."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def pretty(value: Any) -> bytes:
    """JSON as TorchServe's frontend prints it (Gson, pretty, no HTML escaping)."""
    return json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def model_not_found(name: str) -> TorchServeError:
    return TorchServeError(404, "ModelNotFoundException", f"Model not found: {name}")


def version_not_found(name: str, version: str) -> TorchServeError:
    return TorchServeError(
        404,
        "ModelVersionNotFoundException",
        f"Model version: {version} does not exist for model: {name}",
    )


def from_error(error: Exception) -> TorchServeError:
    """TorchServe's form of any failure (an unexpected one is logged)."""
    if isinstance(error, TorchServeError):
        return error
    if isinstance(error, ApplianceError):
        return _from_appliance(error)
    log.error("TorchServe request failed", exc_info=error)
    return TorchServeError(500, "InternalServerException", f"{type(error).__name__}: {error}")


def _from_appliance(error: ApplianceError) -> TorchServeError:
    message = error.message
    if isinstance(error, ModelFailed):
        return TorchServeError(error.status or 503, "InternalServerException", message)
    if isinstance(error, ModelNotFound):
        return TorchServeError(404, "ModelNotFoundException", message)
    if isinstance(error, ModelNotReady | Overloaded):
        return TorchServeError(503, "ServiceUnavailableException", message)
    if isinstance(error, TooLarge):
        return TorchServeError(413, "RequestEntityTooLargeException", message)
    if isinstance(error, DeadlineExceeded):
        return TorchServeError(408, "RequestTimeoutException", message)
    if isinstance(error, BadRequest | Unsupported):
        return TorchServeError(400, "BadRequestException", message)
    return TorchServeError(error.status or 500, "InternalServerException", message)


def encode_error(error: TorchServeError) -> bytes:
    return pretty({"code": error.status, "type": error.kind, "message": error.message})
