"""GraphPipe's error forms: numeric codes in InferResponse.errors, or HTTP 400.

SPEC: specs/graphpipe.md §3.3.1.1 — each error SHOULD carry a numeric code
so clients can tell problems apart without parsing the message. A request
that decodes gets an ``InferResponse`` whose ``errors`` hold one
``(code, message)`` (the Python client raises it); a body that is not a
flatbuffer ``Request`` gets HTTP 400 with a text/plain message, as the Go
reference server answers (PROTOCOL-FACTS §1.2).
"""

from __future__ import annotations

import enum

from appliance.errors import ApplianceError, ErrorCode


class GraphPipeCode(enum.IntEnum):
    """Codes of ``Error.code`` in an InferResponse; stable, never renumbered."""

    BAD_REQUEST = 1  # the model refused the request (e.g. inputs disagree on the batch size)
    UNKNOWN_MODEL = 2
    MODEL_NOT_READY = 3
    UNKNOWN_INPUT = 4  # an input name the model does not declare
    MISSING_INPUT = 5  # a declared input got no tensor
    INPUT_NAMES = 6  # names and tensors disagree in count, or a name repeats
    UNKNOWN_OUTPUT = 7  # an output name the model does not declare or return
    TYPE_MISMATCH = 8  # the tensor's type is not the declared one, nor convertible
    VALUE_OUT_OF_RANGE = 9  # a conversion would change a value (see bind.py)
    SHAPE_MISMATCH = 10  # the shape does not fit the declared one
    BAD_SHAPE = 11  # a negative dimension, too many, or too many elements
    DATA_LENGTH = 12  # data/string_val do not hold the shape's element count
    UNSUPPORTED_TYPE = 13  # type Null or a number outside the spec's table
    BAD_CONFIG = 14  # InferRequest.config is not UTF-8 text
    TOO_LARGE = 15
    OVERLOADED = 16
    DEADLINE_EXCEEDED = 17
    WORKER_LOST = 18
    MODEL_FAILED = 19
    UNSUPPORTED = 20  # the model does not implement what was asked
    INTERNAL = 21
    REJECTED = 22  # the model's queue policy refused it (a full level, a timeout)


class GraphPipeError(Exception):
    """A problem with a request that decoded, reported in InferResponse.errors."""

    def __init__(self, code: GraphPipeCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class DecodeError(ValueError):
    """The body is not a well-formed flatbuffer Request (HTTP 400)."""


_FROM_APPLIANCE: dict[ErrorCode, GraphPipeCode] = {
    ErrorCode.BAD_REQUEST: GraphPipeCode.BAD_REQUEST,
    ErrorCode.MODEL_NOT_FOUND: GraphPipeCode.UNKNOWN_MODEL,
    ErrorCode.MODEL_NOT_READY: GraphPipeCode.MODEL_NOT_READY,
    ErrorCode.UNSUPPORTED: GraphPipeCode.UNSUPPORTED,
    ErrorCode.TOO_LARGE: GraphPipeCode.TOO_LARGE,
    ErrorCode.OVERLOADED: GraphPipeCode.OVERLOADED,
    ErrorCode.REJECTED: GraphPipeCode.REJECTED,
    ErrorCode.DEADLINE_EXCEEDED: GraphPipeCode.DEADLINE_EXCEEDED,
    ErrorCode.WORKER_LOST: GraphPipeCode.WORKER_LOST,
    ErrorCode.MODEL_FAILED: GraphPipeCode.MODEL_FAILED,
    ErrorCode.INTERNAL: GraphPipeCode.INTERNAL,
}

# What a metadata request (which has no error field) answers instead, as
# HTTP status lines with a text/plain body.
_HTTP_STATUS: dict[ErrorCode, str] = {
    ErrorCode.BAD_REQUEST: "400 Bad Request",
    ErrorCode.MODEL_NOT_FOUND: "404 Not Found",
    ErrorCode.MODEL_NOT_READY: "503 Service Unavailable",
    ErrorCode.OVERLOADED: "429 Too Many Requests",
    ErrorCode.REJECTED: "503 Service Unavailable",
    ErrorCode.TOO_LARGE: "413 Payload Too Large",
}


def from_appliance(error: ApplianceError) -> GraphPipeError:
    """Map an appliance error onto its GraphPipe code, keeping the message."""
    return GraphPipeError(_FROM_APPLIANCE.get(error.code, GraphPipeCode.INTERNAL), error.message)


def http_status(error: ApplianceError) -> str:
    """Return the HTTP status line for an error where no flatbuffer can carry it."""
    return _HTTP_STATUS.get(error.code, "500 Internal Server Error")
