"""The auth tokens file (``[auth] tokens_file``): its tokens, what each opens, until when.

One token a line, or TorchServe's ``key_file.json`` (appliance/formats/torchserve/keys.py
writes one for ``appliance serve --model-store``). The config reader checks the
file with :func:`read_tokens`; every frontend reads it again when it changes
(appliance/frontends/auth.py).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Token:
    """An accepted token: the APIs it opens (None: every one) and until when (0: for ever)."""

    value: str
    scopes: frozenset[str] | None = None
    expires: float = 0.0


# TorchServe's key file (key_file.json): the API each of its keys opens, by its entry.
KEY_FILE_SCOPES = {"inference": "inference", "management": "management", "API": "token"}


def read_tokens(path: Path) -> list[Token]:
    """Read an auth tokens file: one token a line, blank lines and # comments skipped;
    or TorchServe's ``key_file.json`` (a JSON object), whose keys each open one API
    until their expiration time.

    Raises:
        ValueError: unreadable, no token, or a line with whitespace inside.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as ex:
        raise ValueError(f"cannot read {path}: {ex}") from None
    if text.lstrip().startswith("{"):
        return _key_file_tokens(path, text)
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if any(char.isspace() for char in token):
            raise ValueError(f"{path} line {number}: a token may not contain whitespace")
        tokens.append(Token(token))
    if not tokens:
        raise ValueError(f"{path} holds no token (one per line; # starts a comment)")
    return tokens


def _key_file_tokens(path: Path, text: str) -> list[Token]:
    try:
        found = json.loads(text)
        tokens = []
        for entry, scope in KEY_FILE_SCOPES.items():
            key = found[entry]["key"]
            expires = found[entry].get("expiration time")
            when = expiration_epoch(expires) if expires else 0.0
            tokens.append(Token(str(key), frozenset({scope}), when))
    except (ValueError, KeyError, TypeError, AttributeError) as ex:
        raise ValueError(
            f"{path}: not a TorchServe key file ({type(ex).__name__}: {ex}); it holds "
            f"{', '.join(KEY_FILE_SCOPES)} entries, each with a key"
        ) from None
    return tokens


def expiration_epoch(text: str) -> float:
    """A TorchServe key's expiration time (``2026-11-29T09:11:16.039888658Z``) as epoch seconds.

    Raises:
        ValueError: another form.
    """
    whole, _, fraction = text.removesuffix("Z").partition(".")
    moment = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S")
    seconds = moment.replace(tzinfo=datetime.UTC).timestamp()
    return seconds + (float(f"0.{fraction}") if fraction else 0.0)
