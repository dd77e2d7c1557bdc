"""One config value checked against its dataclass field's type, its key named on failure.

:class:`ValueReader` is the base of the config's reader (reader.py): the
state a read carries (the file, the CPUs found, the settings resolved from
"auto"), a failure naming the file and the key, the refusal of unknown keys,
and the reading of a value of each type the dataclasses of settings.py use,
of a whole section of them, and of a path. It is apart so that the
``[[models]]`` reader (model_reader.py) and the checks of a built config
(checks.py) build on it without the top-level reader.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from appliance.config.settings import ConfigError


class ValueReader:
    """Check values against the dataclasses' field types, naming keys."""

    def __init__(self, source: str, n_cpus: int = 1) -> None:
        self.source = source
        self.n_cpus = n_cpus
        self.auto: list[str] = []  # the settings resolved from "auto"

    def fail(self, key: str, message: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {key}: {message}")

    def no_extra(self, data: Mapping[str, Any], known: set[str], where: str) -> None:
        if not isinstance(data, Mapping):
            self.fail(where or "(top level)", f"expected a table, got {type(data).__name__}")
        for key in data:
            if key not in known:
                prefix = f"{where}." if where else ""
                allowed = ", ".join(sorted(known - {"source"}))
                self.fail(f"{prefix}{key}", f"unknown key; expected one of {allowed}")

    def section(self, cls: Any, data: Mapping[str, Any], where: str) -> Any:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        self.no_extra(data, set(fields), where)
        values = {
            name: self.value(f"{where}.{name}", data[name], fields[name].type)
            for name in fields
            if name in data
        }
        return cls(**values)

    def value(self, key: str, raw: Any, kind: Any) -> Any:
        kind = str(kind)
        if kind in ("bool", "bool | str"):
            return self.flag(key, raw, strings=kind != "bool")
        if kind in ("int", "int | None"):
            if raw is None and "None" in kind:
                return None
            if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
                self.fail(key, f"expected an integer >= 0, got {raw!r}")
            return raw
        if kind in ("float", "float | None"):
            if raw is None and "None" in kind:
                return None
            if isinstance(raw, bool) or not isinstance(raw, int | float) or raw < 0:
                self.fail(key, f"expected a number >= 0, got {raw!r}")
            return float(raw)
        if kind == "str":
            if not isinstance(raw, str):
                self.fail(key, f"expected a string, got {raw!r}")
            return raw
        if kind == "tuple[str, ...]":
            if not isinstance(raw, list | tuple) or not all(isinstance(s, str) for s in raw):
                self.fail(key, f"expected a list of strings, got {raw!r}")
            return tuple(raw)
        raise AssertionError(f"no reader for {kind}")

    def flag(self, key: str, raw: Any, strings: bool) -> bool | str:
        """A boolean, or (``strings``) a boolean or a string (checked in checks.py)."""
        if not isinstance(raw, bool | str) or (isinstance(raw, str) and not strings):
            self.fail(
                key, f"expected true or false{' or a string' if strings else ''}, got {raw!r}"
            )
        return raw

    def path(self, key: str, raw: Any) -> str:
        """A file's path; a relative one starts at the config file's directory."""
        text = self.value(key, raw, "str")
        if not text:
            return ""
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = Path(self.source).parent.absolute() / path
        return os.path.normpath(path)
