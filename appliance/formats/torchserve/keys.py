"""TorchServe's token authorization keys: ``key_file.json`` in the working directory.

TorchServe 0.12 turns token authorization on unless ``--disable-token-auth``
(or ``disable_token_authorization=true``) says otherwise: it writes
``key_file.json`` into the directory it was started from, with an
inference key, a management key (each valid for an hour) and a key for its
token API, and every call to the inference API (``/ping`` too) must send
``Authorization: Bearer <inference key>``, every call to the management API
the management key. ``GET`` or ``POST /token?type=inference`` (or
``management``) with the API key makes a new key of that kind, valid for
another hour, and the old one is refused from then on.

``appliance serve`` on a model store does the same (:func:`write`): the file,
readable by its owner alone, is the appliance's ``[auth] tokens_file`` (see
``config/tokens.py``), which every frontend reads again when it changes,
and it is removed when the appliance stops. :func:`renew` is the token
API's (frontends/auth.py).
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = "key_file.json"
# How long an inference or management key lasts (TorchServe's token_expiration_min).
LIFETIME_S = 60 * 60
# TorchServe's keys are 8 URL-safe characters.
KEY_BYTES = 6
KINDS = ("inference", "management")


@dataclass(frozen=True, slots=True)
class Keys:
    key_file: Path

    def remove(self) -> None:
        self.key_file.unlink(missing_ok=True)


def write(directory: Path) -> Keys:
    """Write ``directory/key_file.json`` with fresh keys.

    Raises:
        OSError: it cannot be written.
    """
    found = {kind: _key() for kind in ("management", "inference")}
    found["API"] = {"key": secrets.token_urlsafe(KEY_BYTES)}
    key_file = directory / KEY_FILE
    _private(key_file, found)
    return Keys(key_file)


def renew(key_file: Path, kind: str) -> None:
    """Replace ``kind``'s key ("inference" or "management") in ``key_file`` by a new one.

    Raises:
        OSError, ValueError: the file cannot be read or written.
    """
    found = json.loads(key_file.read_text())
    found[kind] = _key()
    _private(key_file, found)


def _key() -> dict[str, str]:
    return {"key": secrets.token_urlsafe(KEY_BYTES), "expiration time": _expiration()}


def _expiration() -> str:
    """An hour from now, as TorchServe writes it (UTC, nanoseconds, a Z)."""
    ns = time.time_ns() + LIFETIME_S * 1_000_000_000
    moment = datetime.datetime.fromtimestamp(ns // 1_000_000_000, datetime.UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ns % 1_000_000_000:09d}Z"


def _private(path: Path, found: dict[str, dict[str, str]]) -> None:
    """Write ``found`` to ``path`` whole at once: a frontend reading it meanwhile sees the
    old keys or the new, never half a file."""
    writing = path.with_name(f".{path.name}.{os.getpid()}")
    handle = os.open(writing, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(handle, "w") as stream:
        stream.write(json.dumps(found, indent=2) + "\n")
    writing.replace(path)
