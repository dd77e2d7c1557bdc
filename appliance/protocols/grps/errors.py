"""GRPS's error form, and the appliance's errors mapped onto it.

SPEC: grps.md "统一payload" and PROTOCOL-FACTS §3.2, §7.3 — every reply
carries ``status {code, msg, status}``; a failure is ``status: FAILURE``
with an HTTP-style code and a message. gRPC calls always end with gRPC
status OK (the error lives in the message only); over HTTP the status line
equals ``status.code``, as GRPS's Python server does (its C++ server answers
200 and relies on the body alone; clients must read the body either way).

This module is pure: no falcon, no grpc.
"""

from __future__ import annotations

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
    WorkerLost,
)

OK = 200


class GrpsError(Exception):
    """A failure as GRPS reports it: an HTTP-style code and a message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"GrpsError({self.code}, {self.message!r})"


def bad_request(message: str) -> GrpsError:
    return GrpsError(400, message)


# Checked in order, so a subclass would be found before its base.
_CODES: tuple[tuple[type[ApplianceError], int], ...] = (
    (BadRequest, 400),
    (ModelNotFound, 404),
    (TooLarge, 413),
    (Unsupported, 501),
    (ModelNotReady, 503),
    (Overloaded, 429),  # a full queue: retry later
    (WorkerLost, 503),
    (DeadlineExceeded, 504),
    (ModelFailed, 500),
)


def from_appliance(error: ApplianceError) -> GrpsError:
    """Map an appliance error onto a GRPS status code, keeping its message."""
    for cls, code in _CODES:
        if isinstance(error, cls):
            return GrpsError(code, error.message)
    return GrpsError(500, error.message)
