"""UM-Bridge's error form, and the appliance's errors mapped onto it.

SPEC: umbridge.md "Errors" and PROTOCOL-FACTS §5.1 — every error is HTTP 400
(user errors) or 500 (model-side errors) with exactly this body::

    {"error": {"type": <one of ErrorType>, "message": <string>}}

The spec names four types. Failures it has no word for (a model not loaded
yet, a full queue, a deadline, a lost worker) keep the appliance's own error
name as the type, with the HTTP status a load balancer understands; clients
only print the type and the message.

This module is pure: no falcon, no sockets.
"""

from __future__ import annotations

import enum

import orjson

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


class ErrorType(enum.StrEnum):
    """The error types the UM-Bridge spec defines."""

    INVALID_INPUT = "InvalidInput"
    INVALID_OUTPUT = "InvalidOutput"
    MODEL_NOT_FOUND = "ModelNotFound"
    UNSUPPORTED_FEATURE = "UnsupportedFeature"


class UmBridgeError(Exception):
    """An error as UM-Bridge reports it: HTTP status, type and message."""

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message

    def __repr__(self) -> str:
        return f"UmBridgeError({self.status}, {self.type!r}, {self.message!r})"


def invalid_input(message: str) -> UmBridgeError:
    return UmBridgeError(400, ErrorType.INVALID_INPUT, message)


def invalid_output(message: str) -> UmBridgeError:
    return UmBridgeError(500, ErrorType.INVALID_OUTPUT, message)


def model_not_found(message: str) -> UmBridgeError:
    return UmBridgeError(400, ErrorType.MODEL_NOT_FOUND, message)


def unsupported_feature(message: str) -> UmBridgeError:
    return UmBridgeError(400, ErrorType.UNSUPPORTED_FEATURE, message)


# Checked in order, so a subclass would be found before its base.
_MAPPING: tuple[tuple[type[ApplianceError], int, str], ...] = (
    (BadRequest, 400, ErrorType.INVALID_INPUT),
    (TooLarge, 413, ErrorType.INVALID_INPUT),
    (ModelNotFound, 400, ErrorType.MODEL_NOT_FOUND),
    (Unsupported, 400, ErrorType.UNSUPPORTED_FEATURE),
    # SPEC: umbridge.md "Errors" — 500 for model-side errors; the worker
    # reports an output that does not fit the declaration as ModelFailed.
    (ModelFailed, 500, ErrorType.INVALID_OUTPUT),
    (ModelNotReady, 503, "ModelNotReady"),
    (Overloaded, 429, "Overloaded"),  # a full queue: retry later
    (DeadlineExceeded, 504, "DeadlineExceeded"),
)


def from_appliance(error: ApplianceError) -> UmBridgeError:
    """Map an appliance error onto UM-Bridge's status and type."""
    for cls, status, type_ in _MAPPING:
        if isinstance(error, cls):
            return UmBridgeError(status, type_, error.message)
    # WorkerLost, InternalError and anything new: a server-side failure.
    return UmBridgeError(500, type(error).__name__, error.message)


def encode_error(error: UmBridgeError) -> bytes:
    """Return the error body, with exactly the keys the spec names."""
    return orjson.dumps({"error": {"type": str(error.type), "message": error.message}})
