"""The protocol-neutral error tree.

Every failure a user can see is one of these. Each protocol maps them onto
its own error form (HTTP status and body, gRPC status code, GraphPipe or MIP
error frame) in ``protocols/<name>/errors.py``; across processes an error
travels as ``(code, message)`` inside a descriptor, never as a pickle.

    ApplianceError
     +-- BadRequest          the request is malformed or does not fit the model
     +-- ModelNotFound       no model of that name is configured
     +-- ModelNotReady       the model is configured but has no ready instance
     +-- Unsupported         the model does not implement what was asked
     +-- TooLarge            a tensor or request exceeds a configured limit
     +-- Overloaded          a queue or ring is full; try again later
     |    +-- ShmExhausted   the shared-memory filesystem (/dev/shm) is full
     |    +-- Rejected       the model's queue policy refused it (unavailable)
     +-- DeadlineExceeded    the request's deadline passed before it finished
     +-- WorkerLost          the model worker died while holding the request
     +-- ModelFailed         the model's own code raised
     +-- InternalError       a bug in the appliance

Messages name the model, the tensor, the limit and the value, so that a user
can act on them without reading logs.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable numbers for the error kinds; they cross process boundaries."""

    OK = 0
    BAD_REQUEST = 1
    MODEL_NOT_FOUND = 2
    MODEL_NOT_READY = 3
    UNSUPPORTED = 4
    TOO_LARGE = 5
    OVERLOADED = 6
    DEADLINE_EXCEEDED = 7
    WORKER_LOST = 8
    MODEL_FAILED = 9
    INTERNAL = 10
    REJECTED = 11


class ApplianceError(Exception):
    """Base of every error the appliance reports to a client."""

    code: ErrorCode = ErrorCode.INTERNAL
    # True when a stream the model had started ended with this error (the
    # model's own answer to the request), not a refusal before it ran.
    ends_stream: bool = False

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        # The HTTP status the model's own code chose for this failure (a
        # TorchServe handler's PredictionException); 0: the protocol's own.
        self.status = status

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class BadRequest(ApplianceError):
    code = ErrorCode.BAD_REQUEST


class ModelNotFound(ApplianceError):
    code = ErrorCode.MODEL_NOT_FOUND


class ModelNotReady(ApplianceError):
    code = ErrorCode.MODEL_NOT_READY


class Unsupported(ApplianceError):
    code = ErrorCode.UNSUPPORTED


class TooLarge(ApplianceError):
    code = ErrorCode.TOO_LARGE


class Overloaded(ApplianceError):
    code = ErrorCode.OVERLOADED


class ShmExhausted(Overloaded):
    """No room left in /dev/shm for a segment: a resource-exhausted error.

    It crosses processes as Overloaded (its code), which every protocol
    already words as its resource-exhausted form; the message names shared
    memory, the bytes wanted and the bytes free.
    """


class Rejected(Overloaded):
    """A model's queue policy refused the request: its priority level's queue was
    full, or it waited past its queue timeout (Triton's dynamic_batching queue
    policies). Protocols that know "unavailable" answer with it, as Triton does;
    the others as with any full queue."""

    code = ErrorCode.REJECTED


class DeadlineExceeded(ApplianceError):
    code = ErrorCode.DEADLINE_EXCEEDED


class WorkerLost(ApplianceError):
    code = ErrorCode.WORKER_LOST


class ModelFailed(ApplianceError):
    code = ErrorCode.MODEL_FAILED


class InternalError(ApplianceError):
    code = ErrorCode.INTERNAL


_BY_CODE: dict[ErrorCode, type[ApplianceError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        ModelNotFound,
        ModelNotReady,
        Unsupported,
        TooLarge,
        Overloaded,
        Rejected,
        DeadlineExceeded,
        WorkerLost,
        ModelFailed,
        InternalError,
    )
}


def error_from_code(code: int, message: str, status: int = 0) -> ApplianceError:
    """Rebuild an error that crossed a process boundary as (code, message, status)."""
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except (ValueError, KeyError):
        cls = InternalError
    return cls(message, status)


class ControlError(Exception):
    """The master's control socket did not answer, or the master refused the command.

    Outside the tree above: it is the control plane's failure (``appliance
    ctl``, model load and unload), which each protocol words for its caller.
    """
