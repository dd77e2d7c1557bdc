"""OpenAI's error object and the statuses its clients act on.

Every failure is ``{"error": {"message", "type", "param", "code"}}``, as the
``openai`` client reads it into ``APIStatusError.body``; the status decides
which exception it raises (400 BadRequestError, 404 NotFoundError, 429 and
5xx are retried). An error after a stream has begun is sent as one event of
this same object, which the client raises from its iterator.
"""

from __future__ import annotations

import logging
from typing import Any

import falcon
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

log = logging.getLogger("appliance.openai")

INVALID = "invalid_request_error"
SERVER = "server_error"


class OpenAIError(Exception):
    """A failure answered in OpenAI's form."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = INVALID,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code

    def document(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """A 400 for a request the client must change."""
    return OpenAIError(400, message, INVALID, param, code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist: GET /v1/models lists the models served",
        INVALID,
        "model",
        "model_not_found",
    )


def from_error(error: Exception) -> OpenAIError:
    """OpenAI's form of any failure; an unexpected one is logged with its traceback."""
    if isinstance(error, OpenAIError):
        return error
    if isinstance(error, ApplianceError):
        return _from_appliance(error)
    log.error("OpenAI request failed", exc_info=error)
    return OpenAIError(500, f"internal error: {type(error).__name__}: {error}", SERVER)


def _from_appliance(error: ApplianceError) -> OpenAIError:
    message = error.message
    if isinstance(error, ModelNotFound):
        return OpenAIError(404, message, INVALID, "model", "model_not_found")
    if isinstance(error, BadRequest | Unsupported):
        return OpenAIError(400, message, INVALID)
    if isinstance(error, TooLarge):
        return OpenAIError(413, message, INVALID, None, "request_too_large")
    if isinstance(error, Overloaded):
        return OpenAIError(429, message, SERVER, None, "overloaded")
    if isinstance(error, ModelNotReady):
        return OpenAIError(503, message, SERVER, None, "model_not_ready")
    if isinstance(error, DeadlineExceeded):
        return OpenAIError(504, message, SERVER, None, "timeout")
    if isinstance(error, ModelFailed):
        return OpenAIError(error.status or 500, message, SERVER, None, "model_failed")
    return OpenAIError(error.status or 500, message, SERVER)


def encode_error(error: OpenAIError) -> bytes:
    return orjson.dumps(error.document())


def render(_req: falcon.Request, resp: falcon.Response, error: Exception) -> None:
    """Answer ``error`` in OpenAI's form (the protocol's guard, see web.guarded)."""
    answer = from_error(error)
    resp.status = falcon.code_to_http_status(answer.status)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = encode_error(answer)
