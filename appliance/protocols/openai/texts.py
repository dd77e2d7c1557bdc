"""A model's tokenizer directory: its chat template and its token counts.

A tokenizer directory is what ``transformers`` saves (``save_pretrained``):
``tokenizer_config.json`` (with ``chat_template``, ``bos_token``,
``eos_token``), ``chat_template.jinja`` in newer releases, and
``tokenizer.json``. The routes look for one, in this order:

1. the model's ``tokenizer`` option (config.toml; a path, relative to the
   model directory);
2. ``tokenizer/`` in the model's version directory, then in its model directory;
3. ``[openai] tokenizer`` in the appliance's config, for every model.

The template is rendered with Jinja2 in a sandbox, as ``transformers``'
``apply_chat_template`` renders it (``add_generation_prompt``, the special
tokens, ``raise_exception``); counts come from the ``tokenizers`` library.
Both are optional (the ``openai`` extra): without them a chat needs a model
that takes messages, and usage comes from the model's own counts.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from appliance.protocols.openai.errors import invalid

log = logging.getLogger("appliance.openai")

TOKENIZER_DIR = "tokenizer"


class TemplateError(Exception):
    """A chat template refused the messages (its raise_exception)."""


class Texts:
    """One tokenizer directory, read when first needed."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    @cached_property
    def _config(self) -> dict[str, Any]:
        if self.directory is None:
            return {}
        path = self.directory / "tokenizer_config.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as ex:
            if path.exists():
                log.warning("%s: unreadable (%s): no chat template from it", path, ex)
            return {}
        return data if isinstance(data, dict) else {}

    @cached_property
    def template(self) -> str | None:
        """The chat template's source, or None."""
        if self.directory is not None:
            separate = self.directory / "chat_template.jinja"
            if separate.is_file():
                return separate.read_text()
        given = self._config.get("chat_template")
        if isinstance(given, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in given if isinstance(t, dict)}
            given = named.get("default")
        return given if isinstance(given, str) else None

    @cached_property
    def _compiled(self) -> Any:
        try:
            from jinja2.exceptions import TemplateError as JinjaError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            return None
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise
        environment.globals["strftime_now"] = _strftime_now
        try:
            return environment.from_string(self.template or "")
        except JinjaError as ex:
            log.warning("%s: its chat template does not compile: %s", self.directory, ex)
            return None

    def render(self, messages: list[dict[str, Any]], model: str) -> str:
        """The prompt for ``messages``, with the generation prompt added.

        Raises:
            OpenAIError: no template, no Jinja2, or the template refused the messages.
        """
        if self.template is None:
            raise invalid(
                f"model {model} has no chat template: give it a tokenizer directory with "
                "one (tokenizer/ beside its versions, or [openai] tokenizer), or call "
                "/v1/completions with a prompt",
                "messages",
            )
        compiled = self._compiled
        if compiled is None:
            raise invalid(
                f"model {model}'s chat template cannot be rendered: install the appliance's "
                "openai extra (Jinja2), and check the log for the template's error",
                "messages",
            )
        tokens = {key: _token(self._config.get(key)) for key in _SPECIAL}
        try:
            rendered: str = compiled.render(
                messages=messages, add_generation_prompt=True, tools=None, **tokens
            )
        except TemplateError as ex:
            raise invalid(
                f"model {model}'s chat template refused the messages: {ex}", "messages"
            ) from None
        except Exception as ex:  # a template is the model author's code
            raise invalid(
                f"model {model}'s chat template failed: {type(ex).__name__}: {ex}", "messages"
            ) from None
        return rendered

    @cached_property
    def _tokenizer(self) -> Any:
        if self.directory is None or not (self.directory / "tokenizer.json").is_file():
            return None
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return None
        try:
            return Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        except Exception as ex:  # a file the library cannot read
            log.warning("%s/tokenizer.json: unreadable: %s", self.directory, ex)
            return None

    def count(self, text: str) -> int | None:
        """``text``'s tokens, or None without a tokenizer."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            return None
        return len(tokenizer.encode(text, add_special_tokens=False).ids)


_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token(value: Any) -> str:
    """A special token as tokenizer_config.json gives it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


def tokenizer_dir(
    options: Mapping[str, Any] | None, default: str, model_dir: Path | None
) -> Path | None:
    """Where a model's tokenizer directory is (see the module's order), or None."""
    given = (options or {}).get("tokenizer")
    if isinstance(given, str) and given:
        path = Path(given)
        if not path.is_absolute() and model_dir is not None:
            path = model_dir / path
        return path
    path_option = (options or {}).get("path")
    if isinstance(path_option, str):
        version_dir = Path(path_option).parent
        for place in (version_dir, version_dir.parent):
            if (place / TOKENIZER_DIR).is_dir():
                return place / TOKENIZER_DIR
    return Path(default) if default else None
