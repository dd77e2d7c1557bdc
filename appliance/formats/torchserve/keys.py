"""TorchServe's token authorization keys: ``key_file.json`` in the working directory.

TorchServe 0.12 turns token authorization on unless ``--disable-token-auth``
(or ``disable_token_authorization=true``) says otherwise: it writes
``key_file.json`` into the directory it was started from, with an
inference key, a management key and a key for its token API, and every
call must send ``Authorization: Bearer <key>``. ``appliance serve`` on a
model store does the same (:func:`write`): the file, for its users, and a
tokens file of the two keys for the appliance's own bearer-token auth
(``[auth] tokens_file``), both readable by their owner alone, both removed
when the appliance stops. The keys do not expire (the file says so with an
expiration time that never comes), and either key opens every API.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

KEY_FILE = "key_file.json"
# What the file's "expiration time" says of keys that do not expire.
NEVER = "9999-12-31T23:59:59.999999Z"
# TorchServe's keys are 8 URL-safe characters.
KEY_BYTES = 6


@dataclass(frozen=True, slots=True)
class Keys:
    key_file: Path
    tokens_file: Path

    def remove(self) -> None:
        self.key_file.unlink(missing_ok=True)
        self.tokens_file.unlink(missing_ok=True)


def write(directory: Path, tokens_file: Path) -> Keys:
    """Write ``directory/key_file.json`` and ``tokens_file`` with fresh keys.

    Raises:
        OSError: either file cannot be written.
    """
    inference, management, api = (secrets.token_urlsafe(KEY_BYTES) for _ in range(3))
    found = {
        "management": {"key": management, "expiration time": NEVER},
        "inference": {"key": inference, "expiration time": NEVER},
        "API": {"key": api},
    }
    key_file = directory / KEY_FILE
    _private(key_file, json.dumps(found, indent=2) + "\n")
    _private(tokens_file, f"# TorchServe's keys ({key_file})\n{inference}\n{management}\n")
    return Keys(key_file, tokens_file)


def _private(path: Path, text: str) -> None:
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
