"""Bearer-token auth on every protocol: falcon middleware, a gRPC guard, MIP's rule.

With ``[auth] tokens_file`` set, every request must present one of the
file's tokens (one a line, see ``config/tokens.py``; the file may be
readable by its owner only). The file is read again when it changes, so
tokens rotate without a restart: looked at every RECHECK_S, and at once
before a token is refused (a key file, below, before every request).

The file may be TorchServe's ``key_file.json`` (``appliance serve`` on a
model store writes one; formats/torchserve/keys.py), whose keys each open
one API until they expire: the inference key TorchServe's inference API and
every other protocol's routes, the management key its management API (HTTP
and gRPC), the API key its token API, ``/token?type=inference|management``,
which this module answers itself, with a new key of that kind.

- HTTP: ``Authorization: Bearer <token>``, or Basic auth with the token as
  the password (any user name), which stock clients that take only a URL
  send for ``http://user:<token>@host:8000`` (umbridge, graphpipe). Health
  checks stay open: ``/v2/health/live|ready`` and ``/grps/v1/health/live|ready``.
  A refusal is 401 in the protocol's own error form, with a
  ``WWW-Authenticate`` challenge.
- gRPC: metadata ``authorization: Bearer <token>``; refusals end with
  UNAUTHENTICATED. Open: grpc.health.v1 Check/Watch, KServe ServerLive and
  ServerReady, GRPS CheckLiveness and CheckReadiness.
- MIP cannot carry a token: a listener not marked ``trusted`` answers pings
  (health) and closes a connection at its first other frame, with a
  PROTOCOL error frame that says why (``frontends/mip.py``, which does not
  import this module's falcon and gRPC).

Tokens are compared as SHA-256 digests with ``hmac.compare_digest``, against
every accepted token each time, so the time taken says nothing about them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import falcon
import grpc
import orjson

from appliance.config.settings import ApplianceConfig
from appliance.config.tokens import Token, read_tokens
from appliance.formats.torchserve import keys as torchserve_keys
from appliance.frontends.observe import Context, Wrap, rebuild
from appliance.frontends.observe_http import protocol_of_path
from appliance.protocols.grpc_server import Handler

log = logging.getLogger("appliance.auth")

# How often the tokens file's metadata is looked at for a change.
RECHECK_S = 1.0
OPEN_PATHS = frozenset(
    {
        "/v2/health/live",
        "/v2/health/ready",
        "/grps/v1/health/live",
        "/grps/v1/health/ready",
        "/ping",
    }
)
TORCHSERVE_REFUSAL = (
    "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
)
# TorchServe's refusal of a call to its token API.
TOKEN_API_REFUSAL = TORCHSERVE_REFUSAL.replace("Authorization", "Authentication")
# The APIs a scoped token opens (an unscoped one opens every one).
INFERENCE, MANAGEMENT, TOKEN_API = "inference", "management", "token"
TOKEN_PATH = "/token"
TORCHSERVE_MANAGEMENT_SERVICE = "/org.pytorch.serve.grpc.management."
OPEN_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
        "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Ping",
        "/grps.protos.v1.GrpsService/CheckLiveness",
        "/grps.protos.v1.GrpsService/CheckReadiness",
    }
)
CHALLENGE = 'Bearer realm="appliance", Basic realm="appliance"'


def _digest(token: str | bytes) -> bytes:
    data = token.encode("utf-8", "surrogateescape") if isinstance(token, str) else token
    return hashlib.sha256(data).digest()


class Tokens:
    """The accepted tokens, read from their file and again whenever it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature = self._stat()
        tokens = read_tokens(path)
        self._accepted = _accepted(tokens)
        # A key file's keys are renewed through the token API, and an old key is refused
        # from then on: its file is looked at for each request (a stat), not each second.
        self.key_file = any(token.scopes for token in tokens)
        self._recheck_s = 0.0 if self.key_file else RECHECK_S
        self._next_check = time.monotonic() + self._recheck_s

    def accepts(self, token: str | bytes | None, scope: str = INFERENCE) -> bool:
        """Whether ``token`` is accepted for ``scope`` (constant time per token): a
        token the file changed to is accepted at once."""
        if token is None:
            return False
        presented = _digest(token)
        self._refresh(False)
        if self._opens(presented, scope):
            return True
        # Rotated a moment ago (a key renewed through another frontend)?
        self._refresh(True)
        return self._opens(presented, scope)

    def _opens(self, presented: bytes, scope: str) -> bool:
        opened = False
        now = time.time()
        for digest, scopes, expires in self._accepted:
            same = hmac.compare_digest(presented, digest)
            opened |= (
                same and (scopes is None or scope in scopes) and (not expires or now < expires)
            )
        return opened

    def _stat(self) -> tuple[int, int, int]:
        try:
            info = os.stat(self.path)
        except OSError:
            return (0, 0, 0)
        return (info.st_mtime_ns, info.st_size, info.st_ino)

    def _refresh(self, now_anyway: bool) -> None:
        now = time.monotonic()
        if now < self._next_check and not now_anyway:
            return
        with self._lock:
            if now < self._next_check and not now_anyway:
                return
            self._next_check = now + self._recheck_s
            signature = self._stat()
            if signature == self._signature:
                return
            try:
                accepted = _accepted(read_tokens(self.path))
            except ValueError as ex:
                log.warning("keeping the previous tokens: %s", ex)
                return
            self._signature, self._accepted = signature, accepted
            log.info("read %d tokens from %s", len(accepted), self.path)


def _accepted(tokens: list[Token]) -> tuple[tuple[bytes, frozenset[str] | None, float], ...]:
    return tuple((_digest(token.value), token.scopes, token.expires) for token in tokens)


def load(config: ApplianceConfig) -> Tokens | None:
    """The tokens to check, or None when auth is off."""
    if not config.auth.enabled:
        return None
    return Tokens(Path(config.auth.tokens_file))


# -- HTTP --------------------------------------------------------------------------


def http_token(authorization: str | None) -> str | None:
    """The token in an Authorization header: Bearer, or Basic's password."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == "bearer":
        return value or None
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8", "surrogateescape")
        except (binascii.Error, ValueError):
            return None
        _user, colon, password = decoded.partition(":")
        return password if colon and password else None
    return None


class HttpAuth:
    """falcon middleware: 401 for a request without an accepted token (health aside)."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens

    async def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in OPEN_PATHS or (req.path == "/metrics" and self.tokens.key_file):
            # TorchServe's metrics API takes no key.
            return
        token = http_token(req.get_header("Authorization"))
        protocol = getattr(req.context, "protocol", None) or protocol_of_path(req.method, req.path)
        if protocol == "torchserve" and req.path == TOKEN_PATH:
            self._token_api(req, resp, token)
            return
        if self.tokens.accepts(token, _http_scope(protocol, req.path)):
            return
        why = "no token was sent" if token is None else "the token is not accepted"
        refuse_http(req, resp, f"unauthorized: {why}; send Authorization: Bearer <token>")

    def _token_api(self, req: falcon.Request, resp: falcon.Response, token: str | None) -> None:
        """TorchServe's token API: a new key of the kind asked for, with the API key."""
        kind = req.get_param("type")
        renewed = False
        if kind in torchserve_keys.KINDS and self.tokens.accepts(token, TOKEN_API):
            try:
                torchserve_keys.renew(self.tokens.path, kind)
                renewed = True
            except (OSError, ValueError, KeyError) as ex:
                log.warning("cannot renew the %s key in %s: %s", kind, self.tokens.path, ex)
        if renewed:
            log.info("a new %s key is in %s", kind, self.tokens.path)
            resp.status = falcon.HTTP_200
            resp.content_type = "application/json"
            resp.data = b"\n"  # TorchServe's body: a line with nothing on it
        else:
            torchserve_refusal(resp, TOKEN_API_REFUSAL)
        resp.complete = True


def _http_scope(protocol: str, path: str) -> str:
    """The API an HTTP request calls: TorchServe's management API, or any other."""
    if protocol == "torchserve" and path.startswith("/models"):
        return MANAGEMENT
    return INFERENCE


def refuse_http(req: falcon.Request, resp: falcon.Response, message: str) -> None:
    """Answer 401 in the error form of the protocol the path belongs to."""
    # The observer, which runs first, has named it; it knows where OpenAI's routes are.
    protocol = getattr(req.context, "protocol", None) or protocol_of_path(req.method, req.path)
    resp.status = falcon.HTTP_401
    resp.set_header("WWW-Authenticate", CHALLENGE)
    if protocol == "kserve":
        resp.content_type = "application/json"
        resp.data = orjson.dumps({"error": message})
    elif protocol == "grps":
        resp.content_type = "application/json;charset=utf-8"
        resp.data = orjson.dumps({"status": {"code": 401, "msg": message, "status": "FAILURE"}})
    elif protocol == "umbridge":
        resp.content_type = "application/json"
        resp.data = orjson.dumps({"error": {"type": "Unauthorized", "message": message}})
    elif protocol == "openai":
        error = {"message": message, "type": "invalid_request_error", "param": None}
        resp.content_type = "application/json"
        resp.data = orjson.dumps({"error": {**error, "code": "invalid_api_key"}})
    elif protocol == "torchserve":
        torchserve_refusal(resp, TORCHSERVE_REFUSAL)
    else:
        resp.content_type = "text/plain; charset=utf-8"
        resp.data = message.encode()
    resp.complete = True


def torchserve_refusal(resp: falcon.Response, message: str) -> None:
    """TorchServe's refusal of a key, as its clients read it (a 400)."""
    resp.status = falcon.HTTP_400
    resp.content_type = "application/json"
    body = {"code": 400, "type": "InvalidKeyException", "message": message}
    resp.data = json.dumps(body, indent=2).encode() + b"\n"


def http_middleware(config: ApplianceConfig) -> list[Any]:
    """The middleware to install: [HttpAuth] when auth is on, else none."""
    tokens = load(config)
    return [] if tokens is None else [HttpAuth(tokens)]


# -- gRPC ----------------------------------------------------------------------------


def grpc_token(metadata: Any) -> str | None:
    """The bearer token in a call's ``authorization`` metadata."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() != "bearer":
                return None
            return token.strip() or None
    return None


def grpc_guard(tokens: Tokens) -> Wrap:
    """A wrap (see ``grpc_registry``) that ends a call without an accepted token UNAUTHENTICATED."""

    def guard(handler: Handler, method: str) -> Handler:
        if method in OPEN_METHODS:
            return handler
        scope = MANAGEMENT if method.startswith(TORCHSERVE_MANAGEMENT_SERVICE) else INFERENCE
        return rebuild(handler, lambda behavior: _guarded(handler, behavior, tokens, scope))

    return guard


def _refusal(tokens: Tokens, context: Context, scope: str) -> str | None:
    """Why the call's metadata is refused, or None when its token is accepted."""
    token = grpc_token(context.invocation_metadata())
    if tokens.accepts(token, scope):
        return None
    why = "no token was sent" if token is None else "the token is not accepted"
    return f"unauthorized: {why}; send metadata authorization: Bearer <token>"


def _guarded(handler: Handler, behavior: Any, tokens: Tokens, scope: str) -> Any:
    """``behavior``, run only when the call's token is accepted for ``scope``."""

    async def guarded(request: Any, context: Context) -> Any:
        refusal = _refusal(tokens, context, scope)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
        return await behavior(request, context)

    async def guarded_stream(request: Any, context: Context) -> AsyncIterator[Any]:
        refusal = _refusal(tokens, context, scope)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)
        async for item in behavior(request, context):
            yield item

    return guarded_stream if handler.response_streaming else guarded


def grpc_wraps(config: ApplianceConfig) -> list[Wrap]:
    """The per-call layers auth adds to every gRPC method: its guard when auth is on, else none."""
    tokens = load(config)
    return [] if tokens is None else [grpc_guard(tokens)]
