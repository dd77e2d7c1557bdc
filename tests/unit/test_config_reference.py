"""The generated configuration reference: up to date, complete, and strict about comments."""

from __future__ import annotations

import re
import tomllib

import pytest

from appliance.config import settings as config
from tools import config_reference


def test_the_committed_page_is_what_the_generator_writes() -> None:
    # `make docs-reference` rewrites it; `make docs-check` (make lint) runs the same check.
    committed = config_reference.PAGE.read_text()
    assert committed == config_reference.render(), (
        f"{config_reference.PAGE.relative_to(config_reference.ROOT)} is stale: "
        "run make docs-reference"
    )


def test_every_key_of_the_default_config_is_on_the_page() -> None:
    page = config_reference.PAGE.read_text()
    documented = set(re.findall(r"^### `([^`]+)`$", page, re.MULTILINE))
    text = config.DEFAULT_CONFIG.read_text()
    # The commented-out tables ([tls], [auth]) count as the file's keys too.
    shown = tomllib.loads(text)
    shown |= tomllib.loads(
        "\n".join(
            line.lstrip("# ")
            for line in text.splitlines()
            if re.match(r"^# (\[\w+\]|\w+ = )", line)
        )
    )
    missing = []
    for section, body in shown.items():
        entries = body if isinstance(body, list) else [body]
        prefix = f"{section}[]" if isinstance(body, list) else section
        for entry in entries:
            for key in entry:
                if f"{prefix}.{key}" not in documented and key != "listeners":
                    missing.append(f"{prefix}.{key}")
    assert not missing
    assert {"mip.listeners[].port", "mip.listeners[].model"} <= documented


def test_a_key_without_a_comment_stops_the_generator() -> None:
    with pytest.raises(config_reference.SchemaError, match=r"server\.nothing"):
        config_reference._text(
            "server.nothing", "ServerConfig.nothing", config_reference.TomlNotes(), {}
        )


def test_comments_of_an_array_entry_describe_the_entry_not_the_key() -> None:
    notes = config_reference.toml_notes(
        "[http]\n"
        "max_body_bytes = 1048576  # 1 MiB\n"
        "port = 80  # the port\n"
        "\n"
        "[[models]]\n"
        'name = "identity"\n'
        "response_ring_bytes = 134217728   # 128 MiB: four 16 MiB tensors\n"
    )
    assert notes.comments == {"http.port": "the port"}
