"""Reading a configuration: every value checked once, every error naming its key.

The only builder of the dataclasses of ``appliance/config/settings.py``: :func:`load`
reads a TOML file, :func:`read_snapshot` the master's JSON snapshot, and
:func:`from_dict` (through :func:`build`) checks either mapping; a bad value
raises ConfigError with the file, the key and what was expected.

The reading is layered: one value against its field's type
(value_reader.py), the ``[[models]]`` and ``[[repositories]]`` tables
(model_reader.py), the sections read here, and the checks of the built
config as a whole (checks.py).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from appliance.config import checks, ensembles, sizing
from appliance.config.model_reader import ModelReader
from appliance.config.settings import (
    DEFAULT_CONFIG,
    ApplianceConfig,
    AuthConfig,
    ConfigError,
    EnsembleConfig,
    GrpcConfig,
    HttpConfig,
    MipConfig,
    MipListener,
    ModelConfig,
    OpenAIConfig,
    ServerConfig,
    ShmConfig,
    TlsConfig,
    TracesConfig,
)
from appliance.config.tokens import read_tokens


def load(path: Path | None = None) -> ApplianceConfig:
    """Read and check a TOML config; the packaged default when ``path`` is None.

    The models of its ``[[repositories]]`` are scanned now and join
    ``models``, after the ``[[models]]`` entries.

    Raises:
        ConfigError: the file is missing, not TOML, or a value is invalid.
    """
    path = path or DEFAULT_CONFIG
    try:
        with path.open("rb") as stream:
            data = tomllib.load(stream)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as ex:
        raise ConfigError(f"{path}: not valid TOML: {ex}") from None
    return from_dict(data, str(path), scan_repositories=True)


def from_dict(
    data: Mapping[str, Any], source: str, scan_repositories: bool = False
) -> ApplianceConfig:
    """Check a config mapping (from TOML or a snapshot) and build it.

    Args:
        data: the mapping.
        source: the file it came from; relative repository paths start there.
        scan_repositories: add the models found in ``[[repositories]]`` (a
            snapshot already lists them among its models, so it does not).

    Raises:
        ConfigError: a value is invalid.
    """
    return build(data, source, scan_repositories)


def read_snapshot(path: Path) -> ApplianceConfig:
    """Read a snapshot written by :func:`write_snapshot`.

    Raises:
        ConfigError: the snapshot is missing or invalid.
    """
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as ex:
        raise ConfigError(f"{path}: cannot read the config snapshot: {ex}") from None
    return from_dict(data, str(data.get("source", path)))


# The [[models]] keys a load may override (``appliance ctl``'s and KServe's load).
OVERRIDABLE = ("instances", "max_batch_size", "max_queue_delay_ms")


def with_overrides(model: ModelConfig, overrides: Mapping[str, Any]) -> ModelConfig:
    """Return ``model`` with ``overrides`` (keys of :data:`OVERRIDABLE`) applied and checked.

    Raises:
        ConfigError: a key is not overridable, or a value is invalid.
    """
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise ConfigError(
            f"model {model.name}: cannot override {', '.join(unknown)} at load; "
            f"overridable: {', '.join(OVERRIDABLE)}"
        )
    data = dataclasses.asdict(model)
    data["class"] = data.pop("cls")
    data.update(overrides)
    return Reader("load override").model(f"override of {model.name}", data)


def repository_model(entry: Mapping[str, Any], source: str) -> ModelConfig:
    """Check one entry of ``repository.model_entries`` as a ``[[models]]`` table.

    Raises:
        ConfigError: a value is invalid, or the entry is an ensemble.
    """
    if ensembles.is_ensemble(entry):
        raise ConfigError(
            f"{source}: model {entry.get('name')}: an ensemble is served from the config or a "
            "repository, not loaded from shipped files"
        )
    return Reader(source).model(f"model {entry.get('name')}", entry)


def build(data: Mapping[str, Any], source: str, scan_repositories: bool) -> ApplianceConfig:
    """Check a config mapping and build it (see :func:`from_dict`)."""
    # "source" and "auto" are written by the master into its snapshot.
    known = {"server", "http", "grpc", "mip", "shm", "models", "repositories", "source", "auto"}
    known |= {"tls", "auth", "traces", "openai"}
    Reader(source).no_extra(data, known, "")
    server = data.get("server", {})
    reader = Reader(source, Reader(source).cpus(server))
    repositories = tuple(reader.repositories(data.get("repositories", [])))
    entries = reader.models(data.get("models", []))
    models = [entry for entry in entries if isinstance(entry, ModelConfig)]
    declared = {f"models[{i}]": e for i, e in enumerate(entries) if isinstance(e, EnsembleConfig)}
    # SAFETY: a snapshot's ensembles were resolved from the config file; a
    # step's model since unloaded makes that step not ready, never the
    # snapshot unreadable (every process that starts reads it).
    served_ensembles = tuple(declared.values())
    if scan_repositories:
        scanned = reader.repository_models(repositories)
        models += [entry for entry in scanned if isinstance(entry, ModelConfig)]
        found = [entry for entry in scanned if isinstance(entry, EnsembleConfig)]
        try:
            served_ensembles, broken = ensembles.resolve_all(models, declared, found)
        except ensembles.EnsembleError as ex:
            reader.fail(ex.where, str(ex))
        models += [reader.model("repositories", entry) for entry in broken]
    config = ApplianceConfig(
        source=source,
        server=reader.section(ServerConfig, reader.with_cpus(server), "server"),
        http=reader.section(HttpConfig, reader.sized(data.get("http", {}), "http"), "http"),
        grpc=reader.section(GrpcConfig, reader.sized(data.get("grpc", {}), "grpc"), "grpc"),
        mip=reader.mip(reader.sized(data.get("mip", {}), "mip")),
        shm=reader.section(ShmConfig, data.get("shm", {}), "shm"),
        models=tuple(models),
        repositories=repositories,
        tls=reader.tls(data.get("tls", {})),
        auth=reader.auth(data.get("auth", {})),
        traces=reader.section(TracesConfig, data.get("traces", {}), "traces"),
        openai=reader.section(OpenAIConfig, data.get("openai", {}), "openai"),
        ensembles=served_ensembles,
        auto=(*reader.value("auto", data.get("auto", ()), "tuple[str, ...]"), *reader.auto),
    )
    checks.check(config, reader)
    return config


class Reader(ModelReader):
    """Check a whole config's sections, naming keys."""

    def cpus(self, server: Any) -> int:
        """server.cpus, or (0, the default) the CPUs this process may use."""
        raw = server.get("cpus", 0) if isinstance(server, Mapping) else 0
        return int(self.value("server.cpus", raw, "int")) or sizing.usable_cpus()

    def with_cpus(self, server: Any) -> Any:
        """The server section with the CPUs found, for the snapshot."""
        return {**server, "cpus": self.n_cpus} if isinstance(server, Mapping) else server

    def sized(self, data: Any, section: str) -> Any:
        """A frontend section with ``workers = "auto"`` (the default) made a number."""
        if not isinstance(data, Mapping) or data.get("workers", "auto") != "auto":
            return data
        self.auto.append(f"{section}.workers")
        return {**data, "workers": sizing.auto(f"{section}.workers", self.n_cpus)}

    def mip(self, data: Any) -> MipConfig:
        limits = {
            f.name: f
            for f in dataclasses.fields(MipConfig)
            if f.name not in ("workers", "listeners")
        }
        self.no_extra(data, {"workers", "listeners", *limits}, "mip")
        workers = self.value("mip.workers", data.get("workers", 1), "int")
        values = {
            name: self.value(f"mip.{name}", data[name], field_.type)
            for name, field_ in limits.items()
            if name in data
        }
        for name, value in values.items():
            if not value > 0:
                self.fail(f"mip.{name}", f"expected a value > 0, got {value!r}")
        raw = data.get("listeners", [{"port": 8002}])
        if not isinstance(raw, list):
            self.fail("mip.listeners", "expected an array of {port, model} tables")
        if not raw:
            return MipConfig(0, (), **values)  # no MIP: no port, no process
        listeners = []
        for index, item in enumerate(raw):
            where = f"mip.listeners[{index}]"
            self.no_extra(item, {"port", "model", "trusted"}, where)
            if "port" not in item:
                self.fail(f"{where}.port", "missing")
            port = self.value(f"{where}.port", item["port"], "int")
            model = self.value(f"{where}.model", item.get("model", ""), "str")
            trusted = self.value(f"{where}.trusted", item.get("trusted", False), "bool")
            listeners.append(MipListener(port, model, trusted))
        return MipConfig(workers, tuple(listeners), **values)

    def tls(self, data: Any) -> TlsConfig:
        self.no_extra(data, {"cert", "key"}, "tls")
        cert = self.path("tls.cert", data.get("cert", ""))
        key = self.path("tls.key", data.get("key", ""))
        if bool(cert) != bool(key):
            self.fail("tls", "cert and key go together: give both PEM files, or neither")
        for name, path, private in (("cert", cert, False), ("key", key, True)):
            if path:
                self.check_file(f"tls.{name}", path, 0o007 if private else 0)
        return TlsConfig(cert, key)

    def auth(self, data: Any) -> AuthConfig:
        self.no_extra(data, {"tokens_file"}, "auth")
        tokens_file = self.path("auth.tokens_file", data.get("tokens_file", ""))
        if tokens_file:
            self.check_file("auth.tokens_file", tokens_file, 0o077)
            try:
                read_tokens(Path(tokens_file))
            except ValueError as ex:
                self.fail("auth.tokens_file", str(ex))
        return AuthConfig(tokens_file)

    def check_file(self, key: str, path: str, forbidden: int) -> None:
        """A readable regular file whose mode grants none of ``forbidden``."""
        try:
            info = os.stat(path)
            with open(path, "rb"):
                pass
        except OSError as ex:
            self.fail(key, f"cannot read {path}: {ex.strerror}")
        if not stat.S_ISREG(info.st_mode):
            self.fail(key, f"{path} is not a regular file")
        if info.st_mode & forbidden:
            mode = stat.S_IMODE(info.st_mode)
            self.fail(
                key,
                f"{path} has mode {mode:04o}, readable by others; "
                f"chmod {mode & ~forbidden:04o} it (it holds secrets)",
            )
