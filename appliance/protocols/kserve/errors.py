"""The appliance's errors in KServe's two forms: HTTP status + body, gRPC code.

SPEC: PROTOCOL-FACTS §2.1 — every REST error is ``{"error": "<message>"}``
with Triton's status mapping (INVALID_ARG 400, NOT_FOUND 404, UNAVAILABLE
503, UNSUPPORTED 501, INTERNAL 500); §2.2 — gRPC reports errors as the call's
status. gRPC codes are named here (``grpc.StatusCode[name]``) so that this
module imports no gRPC into the HTTP frontend's arbiter before it forks.
"""

from __future__ import annotations

import orjson

from appliance.errors import ApplianceError, BadRequest, ErrorCode


class RegionExists(BadRequest):
    """A shared-memory region of that name is already registered."""


class RegionNotFound(BadRequest):
    """No shared-memory region of that name is registered (never, or no longer).

    Triton answers NOT_FOUND / 404 (tests/peers/test_triton_shm_oracle.py).
    """


class PollFailed(BadRequest):
    """Model files the repository could not take (a file name over NAME_MAX).

    Triton answers these as its repository poll failing: INTERNAL / 500, the
    form its model-control example client checks for.
    """


class DecodeError(BadRequest):
    """A request's bytes or JSON do not form a valid KServe request."""


# What each error kind is in HTTP.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_READY: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.TOO_LARGE: 413,
    # A full queue: 429 tells clients and balancers to retry later, unlike 503.
    ErrorCode.OVERLOADED: 429,
    # A queue policy's refusal: Triton answers it as unavailable.
    ErrorCode.REJECTED: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.WORKER_LOST: 503,
    ErrorCode.MODEL_FAILED: 500,
    ErrorCode.INTERNAL: 500,
}

# What each error kind is in gRPC (names of grpc.StatusCode members).
GRPC_STATUS: dict[ErrorCode, str] = {
    ErrorCode.BAD_REQUEST: "INVALID_ARGUMENT",
    ErrorCode.MODEL_NOT_FOUND: "NOT_FOUND",
    ErrorCode.MODEL_NOT_READY: "UNAVAILABLE",
    ErrorCode.UNSUPPORTED: "UNIMPLEMENTED",
    ErrorCode.TOO_LARGE: "RESOURCE_EXHAUSTED",
    ErrorCode.OVERLOADED: "RESOURCE_EXHAUSTED",
    ErrorCode.REJECTED: "UNAVAILABLE",
    ErrorCode.DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    ErrorCode.WORKER_LOST: "UNAVAILABLE",
    ErrorCode.MODEL_FAILED: "INTERNAL",
    ErrorCode.INTERNAL: "INTERNAL",
}


# KServe's own kinds of a client's mistake, in Triton's forms: (HTTP status, gRPC code).
OWN_FORMS: dict[type[ApplianceError], tuple[int, str]] = {
    RegionExists: (400, "ALREADY_EXISTS"),
    RegionNotFound: (404, "NOT_FOUND"),
    PollFailed: (500, "INTERNAL"),
}


def _own_form(error: ApplianceError) -> tuple[int, str] | None:
    for kind in type(error).__mro__:
        form = OWN_FORMS.get(kind)
        if form is not None:
            return form
    return None


def http_status(error: ApplianceError) -> int:
    """Return the HTTP status code for ``error``."""
    form = _own_form(error)
    if form is not None:
        return form[0]
    return HTTP_STATUS.get(error.code, 500)


def http_body(error: ApplianceError) -> bytes:
    """Return the JSON error body: ``{"error": message}``."""
    return orjson.dumps({"error": error.message})


def grpc_status(error: ApplianceError) -> str:
    """Return the name of the gRPC status code for ``error``."""
    form = _own_form(error)
    if form is not None:
        return form[1]
    return GRPC_STATUS.get(error.code, "INTERNAL")
