"""Write docs/reference/configuration.md from the config's own schema.

Usage: ``python tools/config_reference.py [--check]``.

Every key comes from the dataclasses of ``appliance/config/settings.py`` (a section
of ``ApplianceConfig`` is a table, a tuple of dataclasses an array of
tables), so a field added there is on the page the next time it is made.
Its type is the field's annotation in words, its default is what
``appliance/config/reader.py`` fills in when the key is left out (read by
running the reader on an almost empty config, not restated here), and its
description is its comment: the one above it or beside it in
``appliance/default.toml`` (a ``#   key = value  text`` line in a comment
block counts too), else the one above or beside the field in
``appliance/config/settings.py``. A key with no comment in either place, a type the
table below has no words for, or a reader default that disagrees with the
dataclass's, stops the generator with the key named, so a key cannot reach
users undocumented. ``--check`` compares with the committed page instead of
writing it (``make docs-check``, run by ``make lint``; a unit test too).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import io
import re
import sys
import tokenize
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appliance.config import ensembles, sizing  # noqa: E402
from appliance.config import reader as config_reader  # noqa: E402
from appliance.config import settings as config  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "configuration.md"
DEFAULT_TOML = config.DEFAULT_CONFIG
CONFIG_PY = Path(config.__file__)

# ApplianceConfig fields that are no table of the file: the master writes
# "source" and "auto" into its snapshot, and "ensembles" are [[models]]
# tables with steps (documented with the models, below).
NOT_SECTIONS = {"source", "auto", "ensembles"}
# The one TOML key whose field is named otherwise ("class" is a keyword).
RENAMED = {"cls": "class"}

# An annotation (as written in config.py) in words. A new annotation stops
# the generator until it is given words here.
TYPE_WORDS = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "bool | str": "boolean or string",
    "int | None": "integer, or unset",
    "float | None": "number, or unset",
    "bool | None": "boolean, or unset",
    "tuple[str, ...]": "array of strings",
    "Mapping[str, Any]": "table",
    "Mapping[str, str]": "table of strings",
    "VersionPolicy": '"latest", "all", or an array of version numbers',
    "tuple[Declared, ...]": "array of { name, dtype, shape } tables",
}
ARRAY_OF = re.compile(r"^tuple\[(\w+), \.\.\.\]$")

# The ensemble's tables (appliance/config/ensembles.py) are read by hand, not from
# the dataclass, so their keys are checked against the fields; "platform"
# selects the kind of table and is stored nowhere.
PLATFORM_TEXT = (
    'A `[[models]]` table with `platform = "ensemble"` (or with `steps`) declares an '
    "ensemble instead of a model class."
)

# A minimal config for the reader: the sections' and arrays' defaults are
# what it builds from these.
MINIMAL: dict[str, Any] = {
    "models": [{"name": "m", "class": "m:M"}],
    "repositories": [{"path": "/repository"}],
}
MINIMAL_ENSEMBLE: dict[str, Any] = {
    "name": "e",
    "platform": config.ENSEMBLE,
    "inputs": [{"name": "IN", "dtype": "FP32", "shape": [-1]}],
    "outputs": [{"name": "OUT", "dtype": "FP32", "shape": [-1]}],
    "steps": [{"model": "m", "input_map": {"I": "IN"}, "output_map": {"O": "OUT"}}],
}


# A key without a default.
REQUIRED = "required"


class SchemaError(Exception):
    """The schema cannot be documented as it is; the message names the key."""


@dataclass
class TomlNotes:
    """What appliance/default.toml says: comments by key, section intros, values."""

    comments: dict[str, str] = field(default_factory=dict)
    intros: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Key:
    """One documented key."""

    name: str
    kind: str
    default: str
    shipped: str | None
    text: str


@dataclass(frozen=True)
class Section:
    """A table or an array of tables, its intro, and its keys."""

    title: str
    intro: str
    keys: tuple[Key, ...]


# -- comments -----------------------------------------------------------------

_HEADER = re.compile(r"^\[\[?([\w.]+)\]\]?$")
_KEY = re.compile(r"^(\w+)\s*=")
_DOC_LINE = re.compile(r"^\s{2,}(\w+) = (\"[^\"]*\"|\S+)\s+(\S.*)$")
_CONTINUED = re.compile(r"^\s{6,}(\S.*)$")


def _section_name(header: str) -> str:
    """The reference's name for a TOML table: "models" for both [[models]] and [models]."""
    return header.split(".")[0]


def toml_notes(text: str) -> TomlNotes:
    """Read default.toml's comments: above or beside a key, or a ``key = value  text`` line.

    A block directly above a table's header is the table's intro; a commented
    header (``# [tls]``) opens a table shown only as an example, whose commented
    keys keep the comments beside them. ``#   key = value  text`` lines belong to
    the next table the file opens ([[models]]: its keys are documented once,
    above the demo entries). The comments of an array's entries ([[models]],
    [[repositories]]) speak of that entry, not of the key, and are skipped; so
    is a comment beside a value that only restates its size ("# 64 MiB").
    """
    notes = TomlNotes(values=tomllib.loads(text))
    section, commented, array = "", False, False
    block: list[str] = []
    pending: dict[str, str] = {}
    for raw in [*text.splitlines(), ""]:
        line = raw.strip()
        content = line[1:].removeprefix(" ") if line.startswith("#") else line
        header = _HEADER.match(content)
        key = _KEY.match(content)
        if header:
            section, commented = _section_name(header.group(1)), line.startswith("#")
            array = content.startswith("[[")
            if not content.startswith("[["):
                notes.intros.setdefault(section, _join(block))
            for name, doc in pending.items():
                notes.comments.setdefault(f"{section}.{name}", doc)
            block, pending = [], {}
        elif line.startswith("#") and commented and key:
            _note(notes, section, key.group(1), "", _trailing(content))
        elif line.startswith("#"):
            block.append(line[1:])
        else:
            if key and not array:  # an array's entries are examples (the demos)
                _note(notes, section, key.group(1), _join(block), _trailing(raw))
            pending |= _doc_lines(block)
            block, commented = [], False
    return notes


_SIZE_ONLY = re.compile(r"^\d+ [KMG]iB$")


def _note(notes: TomlNotes, section: str, key: str, above: str, beside: str) -> None:
    if _SIZE_ONLY.match(beside):  # the page gives the size beside the number
        beside = ""
    text = " ".join(part for part in (above, beside) if part)
    if text:
        notes.comments.setdefault(f"{section}.{key}", text)


def _doc_lines(block: list[str]) -> dict[str, str]:
    """``#   max_queue = 1024   text`` lines, with their indented continuations."""
    found: dict[str, str] = {}
    key = ""
    for line in block:
        doc = _DOC_LINE.match(line)
        more = _CONTINUED.match(line)
        if doc:
            key = doc.group(1)
            found[key] = doc.group(3)
        elif key and more:
            found[key] += " " + more.group(1)
        else:
            key = ""
    return found


def _trailing(raw: str) -> str:
    """The comment after a TOML value, found by tokenizing (a # inside a string is no comment)."""
    for token in _tokens(raw):
        if token.type == tokenize.COMMENT:
            return token.string[1:].strip()
    return ""


def _tokens(line: str) -> Iterator[tokenize.TokenInfo]:
    try:
        yield from tokenize.generate_tokens(io.StringIO(line + "\n").readline)
    except (tokenize.TokenError, SyntaxError):  # TOML that is not Python: no comment found
        return


def _join(lines: list[str]) -> str:
    return " ".join(line.strip() for line in lines if line.strip())


def field_comments(source: str) -> dict[str, str]:
    """``Class.field`` -> the comment above or beside the field in config.py."""
    lines = source.splitlines()
    beside: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and lines[token.start[0] - 1].strip()[:1] != "#":
            beside[token.start[0]] = token.string[1:].strip()
    found: dict[str, str] = {}
    cls = ""
    for number, line in enumerate(lines, 1):
        if line.startswith("class "):
            cls = line.split()[1].split("(")[0].rstrip(":")
            continue
        match = re.match(r"^    (\w+): ", line)
        if not cls or not match:
            continue
        above: list[str] = []
        for earlier in reversed(lines[: number - 1]):
            if not earlier.strip().startswith("#"):
                break
            above.insert(0, earlier.strip()[1:])
        text = " ".join(part for part in (_join(above), beside.get(number, "")) if part)
        if text:
            found[f"{cls}.{match.group(1)}"] = text
    return found


# -- the schema ---------------------------------------------------------------


def sections() -> list[Section]:
    """Every section of ApplianceConfig, with the ensembles' table after the models'."""
    notes = toml_notes(DEFAULT_TOML.read_text())
    comments = field_comments(CONFIG_PY.read_text())
    built = config_reader.from_dict(MINIMAL, "/config.toml")
    found = []
    for item in dataclasses.fields(config.ApplianceConfig):
        if item.name in NOT_SECTIONS:
            continue
        array = ARRAY_OF.match(str(item.type))
        cls = getattr(config, array.group(1) if array else str(item.type))
        value = getattr(built, item.name)
        instance = value[0] if array else value
        title = f"[[{item.name}]]" if array else f"[{item.name}]"
        prefix = f"{item.name}[]" if array else item.name
        intro = notes.intros.get(item.name) or _docstring(cls)
        keys = _keys(cls, instance, prefix, item.name, notes, comments, built.auto)
        found.append(Section(title, intro, tuple(keys)))
        if cls is config.MipConfig:
            found.append(_listeners(built.mip.listeners[0], notes, comments))
        if cls is config.ModelConfig:
            found += _ensemble_sections(comments)
    return found


def _keys(
    cls: Any,
    instance: Any,
    prefix: str,
    section: str,
    notes: TomlNotes,
    comments: dict[str, str],
    auto: tuple[str, ...],
) -> Iterator[Key]:
    shipped = notes.values.get(section, {})
    shipped = shipped[0] if isinstance(shipped, list) and shipped else shipped
    for item in dataclasses.fields(cls):
        if cls is config.MipConfig and item.name == "listeners":
            continue  # a table of its own (_listeners)
        name = RENAMED.get(item.name, item.name)
        value = getattr(instance, item.name)
        if f"{section}.{name}" == "server.cpus":  # the reader writes the CPUs it found
            value = item.default
        sized = _sized(section, name, auto)
        # A frontend's workers are "auto" when left out; a model's instances are 1.
        auto_default = sized and section != "models"
        yield Key(
            name=f"{prefix}.{name}",
            kind=_kind(cls, item) + (' or "auto"' if sized else ""),
            default='"auto"' if auto_default else _default(cls, item, value, f"{prefix}.{name}"),
            shipped=_shipped(shipped, name, section, value, sized),
            text=_text(f"{section}.{name}", f"{cls.__name__}.{item.name}", notes, comments),
        )


def _sized(section: str, name: str, auto: tuple[str, ...]) -> bool:
    """Whether "auto" sizes this key (appliance/config/sizing.py's RULES)."""
    setting = f"{section}.{name}"
    if setting in sizing.RULES:
        if setting not in auto:
            raise SchemaError(f"{setting}: sizing.RULES has it, but the reader did not size it")
        return True
    return section == "models" and name in sizing.RULES


def _shipped(shipped: Any, name: str, section: str, value: Any, sized: bool) -> str | None:
    """default.toml's value where it sets one other than the default."""
    if section in ("models", "repositories") or not isinstance(shipped, Mapping):
        return None  # its entries are the demos, not defaults
    if name not in shipped:
        return None
    if sized and shipped[name] == "auto":
        return None
    if not sized and _same(shipped[name], value):
        return None
    return _toml(shipped[name])


def _same(raw: Any, value: Any) -> bool:
    if isinstance(value, tuple):
        return bool([_plain(v) for v in value] == raw)
    return bool(raw == value)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _listeners(listener: config.MipListener, notes: TomlNotes, comments: dict[str, str]) -> Section:
    keys = [
        Key(
            name=f"mip.listeners[].{item.name}",
            kind=_kind(config.MipListener, item),
            default=_default(config.MipListener, item, getattr(listener, item.name), item.name),
            shipped=None,
            text=_text(f"mip.listeners.{item.name}", f"MipListener.{item.name}", notes, comments),
        )
        for item in dataclasses.fields(config.MipListener)
    ]
    intro = (
        f"{_docstring(config.MipListener)} Each entry of `mip.listeners` is an inline table; "
        f"without `listeners`, one on port {listener.port}. "
        f"{notes.comments.get('mip.listeners', '')}"
    )
    return Section("[mip] listeners", intro.strip(), tuple(keys))


def _ensemble_sections(comments: dict[str, str]) -> list[Section]:
    """The ensemble's [[models]] table and its steps, checked against ensembles.py's keys."""
    fields = {item.name for item in dataclasses.fields(config.EnsembleConfig)}
    if fields | {"platform"} != ensembles.KEYS:
        raise SchemaError(
            f"ensembles.KEYS {sorted(ensembles.KEYS)} and EnsembleConfig's fields "
            f"{sorted(fields)} differ (besides platform)"
        )
    steps = {item.name for item in dataclasses.fields(config.EnsembleStep)}
    if steps != ensembles.STEP_KEYS:
        raise SchemaError(f"ensembles.STEP_KEYS and EnsembleStep's fields differ: {steps}")
    ensemble = ensembles.read(MINIMAL_ENSEMBLE)
    platform = Key("models[].platform", "string", '"ensemble"', None, PLATFORM_TEXT)
    keys = [platform, *_plain_keys(config.EnsembleConfig, ensemble, "models[]", comments)]
    step_keys = _plain_keys(config.EnsembleStep, ensemble.steps[0], "models[].steps[]", comments)
    return [
        Section("[[models]], an ensemble", _docstring(config.EnsembleConfig), tuple(keys)),
        Section("[[models]] steps", _docstring(config.EnsembleStep), tuple(step_keys)),
    ]


def _plain_keys(cls: Any, instance: Any, prefix: str, comments: dict[str, str]) -> list[Key]:
    """Keys documented by config.py alone (default.toml declares no ensemble)."""
    return [
        Key(
            name=f"{prefix}.{item.name}",
            kind=_kind(cls, item),
            default=_default(cls, item, getattr(instance, item.name), f"{prefix}.{item.name}"),
            shipped=None,
            text=_text("", f"{cls.__name__}.{item.name}", TomlNotes(), comments),
        )
        for item in dataclasses.fields(cls)
    ]


def _kind(cls: Any, item: dataclasses.Field[Any]) -> str:
    annotation = str(item.type)
    if annotation in TYPE_WORDS:
        return TYPE_WORDS[annotation]
    array = ARRAY_OF.match(annotation)
    if array and dataclasses.is_dataclass(getattr(config, array.group(1), None)):
        return "array of tables (below)"
    raise SchemaError(
        f"{cls.__name__}.{item.name}: no words for the type {annotation!r}; "
        "add them to TYPE_WORDS in tools/config_reference.py"
    )


def _default(cls: Any, item: dataclasses.Field[Any], value: Any, key: str) -> str:
    """The reader's default, checked against the dataclass's."""
    declared: Any = dataclasses.MISSING
    if item.default is not dataclasses.MISSING:
        declared = item.default
    elif item.default_factory is not dataclasses.MISSING:
        declared = item.default_factory()
    if declared is dataclasses.MISSING:
        return REQUIRED
    if value != declared:
        raise SchemaError(
            f"{key}: the reader's default {value!r} is not the dataclass's {declared!r}"
        )
    return _toml(declared)


def _text(toml_key: str, field_key: str, notes: TomlNotes, comments: dict[str, str]) -> str:
    text = notes.comments.get(toml_key) or comments.get(field_key)
    if not text:
        raise SchemaError(
            f"{toml_key or field_key}: no comment above or beside it in appliance/default.toml "
            f"or appliance/config/settings.py ({field_key}); say what it does there"
        )
    return text


def _docstring(cls: Any) -> str:
    doc = cls.__doc__ or ""
    if doc.startswith(f"{cls.__name__}("):  # the one dataclasses writes for a class without
        return ""
    return _join(doc.split("\n\n")[0].splitlines())


# -- the page -----------------------------------------------------------------

_SIZES = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _toml(value: Any) -> str:
    """A value as TOML writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping) and not value:
        return "{}"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _toml(dataclasses.asdict(value))
    return "[" + ", ".join(_toml(v) for v in value) + "]"


def _size(name: str, value: str) -> str:
    """A byte count's size in words, beside the number."""
    if not name.endswith("_bytes") or not value.isdigit():
        return ""
    number = int(value)
    for unit, word in _SIZES:
        if number >= unit and number % unit == 0:
            return f" ({number // unit} {word})"
    return ""


_CODE = re.compile(r"(``.*?``|`[^`]*`)")


def _markdown(text: str) -> str:
    """Comment text as markdown: <, > and & outside code spans are escaped, not HTML."""
    parts = _CODE.split(text)
    escaped = [
        part
        if part.startswith("`")
        else part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        for part in parts
    ]
    return "".join(escaped)


def render() -> str:
    """The whole page."""
    out = [
        "<!-- AUTOGENERATED by tools/config_reference.py from appliance/config/settings.py and "
        "appliance/default.toml; edit those, then run `make docs-reference`. -->",
        "",
        "# Configuration reference",
        "",
        "Every key the appliance reads, by table: its type, the default it takes when left "
        "out, and what `appliance/default.toml` (the file `make run` serves) sets where that "
        "differs. The descriptions are the comments of `appliance/default.toml` and "
        "`appliance/config/settings.py`. How the pieces fit together is in "
        "[Configuration](../configuration.md).",
        "",
    ]
    for section in sections():
        out += [f"## `{section.title}`", ""]
        if section.intro:
            out += [_markdown(section.intro), ""]
        for key in section.keys:
            facts = f"{key.kind} · " + (
                REQUIRED
                if key.default == REQUIRED
                else f"default `{key.default}`{_size(key.name, key.default)}"
            )
            if key.shipped is not None:
                facts += f" · `appliance/default.toml`: `{key.shipped}`"
            out += [f"### `{key.name}`", "", facts, "", _markdown(key.text), ""]
    out += [
        "## `appliance/default.toml`",
        "",
        "The file as shipped, comments and all:",
        "",
        "```toml",
        DEFAULT_TOML.read_text().rstrip("\n"),
        "```",
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    try:
        text = render()
    except SchemaError as error:
        print(f"tools/config_reference.py: {error}", file=sys.stderr)
        return 1
    if not args.check:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(text)
        return 0
    committed = PAGE.read_text() if PAGE.exists() else ""
    if committed != text:
        diff = difflib.unified_diff(
            committed.splitlines(), text.splitlines(), str(PAGE), "generated", lineterm=""
        )
        print("\n".join(list(diff)[:40]), file=sys.stderr)
        print(f"{PAGE.relative_to(ROOT)} is stale: run make docs-reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
