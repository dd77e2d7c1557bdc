"""[tls] and [auth] settings, and the token checks, without a running appliance."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.config import settings as config_module
from appliance.config.reader import from_dict, load
from appliance.config.settings import ConfigError
from appliance.config.tokens import read_tokens
from appliance.frontends import auth
from tests.system.harness import ROOT


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def config_with(tmp_path: Path, body: str) -> Path:
    return write(tmp_path / "config.toml", body, 0o644)


def test_the_default_config_listens_on_loopback_without_tls_or_auth() -> None:
    config = load()
    assert config.server.host == "127.0.0.1"
    assert not config.tls.enabled
    assert not config.auth.enabled
    assert not any(listener.trusted for listener in config.mip.listeners)


def test_paths_are_relative_to_the_config_file_and_survive_the_snapshot(tmp_path: Path) -> None:
    write(tmp_path / "tokens", "# comment\n\n  abc  \ndef\n")
    write(tmp_path / "server.crt", "cert", 0o644)
    write(tmp_path / "server.key", "key", 0o640)
    path = config_with(
        tmp_path,
        '[tls]\ncert = "server.crt"\nkey = "server.key"\n[auth]\ntokens_file = "tokens"\n'
        "[mip]\nlisteners = [{ port = 9, trusted = true }]\n",
    )
    config = load(path)
    assert config.tls.cert == str(tmp_path / "server.crt")
    assert config.auth.tokens_file == str(tmp_path / "tokens")
    assert config.mip.listeners[0].trusted
    again = from_dict(config_module.to_dict(config), config.source)
    assert (again.tls, again.auth, again.mip.listeners) == (
        config.tls,
        config.auth,
        config.mip.listeners,
    )
    read = read_tokens(Path(config.auth.tokens_file))
    assert [token.value for token in read] == ["abc", "def"]


@pytest.mark.parametrize(
    ("files", "body", "words"),
    [
        ({"tokens": ("t\n", 0o644)}, '[auth]\ntokens_file = "tokens"', "mode 0644, readable by"),
        ({"tokens": ("t\n", 0o640)}, '[auth]\ntokens_file = "tokens"', "chmod 0600"),
        ({}, '[auth]\ntokens_file = "missing"', "No such file"),
        ({"tokens": ("# none\n\n", 0o600)}, '[auth]\ntokens_file = "tokens"', "holds no token"),
        ({"tokens": ("a b\n", 0o600)}, '[auth]\ntokens_file = "tokens"', "line 1"),
        ({"c": ("c", 0o644)}, '[tls]\ncert = "c"', "cert and key go together"),
        (
            {"c": ("c", 0o644), "k": ("k", 0o644)},
            '[tls]\ncert = "c"\nkey = "k"',
            "tls.key: ",
        ),
        ({}, "[auth]\ntoken = 'x'", "unknown key"),
        ({}, "[mip]\nlisteners = [{ port = 9, trusted = 1 }]", "trusted: expected true or false"),
    ],
)
def test_bad_tls_and_auth_settings_name_the_key(
    tmp_path: Path, files: dict[str, tuple[str, int]], body: str, words: str
) -> None:
    for name, (text, mode) in files.items():
        write(tmp_path / name, text, mode)
    with pytest.raises(ConfigError, match=words):
        load(config_with(tmp_path, body))


def test_serve_refuses_to_start_with_a_readable_tokens_file(tmp_path: Path) -> None:
    write(tmp_path / "tokens", "t\n", 0o604)
    path = config_with(tmp_path, '[auth]\ntokens_file = "tokens"\n')
    done = subprocess.run(
        [sys.executable, "-m", "appliance", "serve", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert b"auth.tokens_file" in done.stderr + done.stdout


# -- presenting tokens -------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer abc", "abc"),
        ("bearer   abc  ", "abc"),
        ("Bearer", None),
        ("Token abc", None),
        ("abc", None),
        (basic("user", "abc"), "abc"),
        (basic("", "abc:def"), "abc:def"),
        (basic("user", ""), None),
        ("Basic !!!", None),
        ("Basic " + base64.b64encode(b"no-colon").decode(), None),
    ],
)
def test_tokens_are_read_from_bearer_or_basic_authorization(
    header: str | None, token: str | None
) -> None:
    assert auth.http_token(header) == token


@pytest.mark.parametrize(
    ("metadata", "token"),
    [
        (None, None),
        ((), None),
        ((("authorization", "Bearer abc"),), "abc"),
        ((("x", "y"), ("authorization", b"Bearer abc")), "abc"),
        ((("authorization", "Basic abc"),), None),
        ((("authorization", "Bearer "),), None),
    ],
)
def test_grpc_tokens_come_from_authorization_metadata(metadata: object, token: str | None) -> None:
    assert auth.grpc_token(metadata) == token


def test_tokens_are_compared_against_every_accepted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = auth.Tokens(write(tmp_path / "tokens", "one\ntwo\nthree\n"))
    compared: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    assert tokens.accepts("one")
    assert len(compared) == 3  # no early exit at the first match
    assert all(len(a) == len(b) == 32 for a, b in compared)  # digests, not the tokens
    assert not tokens.accepts("on")
    assert not tokens.accepts("")
    assert not tokens.accepts(None)
    assert tokens.accepts("three")


def test_a_changed_tokens_file_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "RECHECK_S", 0.0)
    path = write(tmp_path / "tokens", "old\n")
    tokens = auth.Tokens(path)
    assert tokens.accepts("old")
    write(path, "new-and-longer\n")
    assert tokens.accepts("new-and-longer")
    assert not tokens.accepts("old")
    write(path, "# emptied by mistake\n")
    assert tokens.accepts("new-and-longer")  # a broken file keeps the last good tokens


def test_mip_listeners_are_locked_unless_trusted(tmp_path: Path) -> None:
    from appliance.frontends.mip import auth_locked

    write(tmp_path / "tokens", "t\n")
    body = '[auth]\ntokens_file = "tokens"\n[mip]\nlisteners = [{ port = 1 }, '
    config = load(config_with(tmp_path, body + "{ port = 2, trusted = true }]\n"))
    assert [auth_locked(config, index) for index in range(2)] == [True, False]
    assert not auth_locked(load(), 0)
