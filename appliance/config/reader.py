"""Reading a configuration: every value checked once, every error naming its key.

The only builder of the dataclasses of ``appliance/config/settings.py``: :func:`load`
reads a TOML file, :func:`read_snapshot` the master's JSON snapshot, and
:func:`from_dict` (through :func:`build`) checks either mapping; a bad value
raises ConfigError with the file, the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import orjson

from appliance.config import device as devices
from appliance.config import ensembles, sizing
from appliance.config.settings import (
    DEFAULT_CONFIG,
    MAX_INLINE_BYTES,
    ApplianceConfig,
    AuthConfig,
    ConfigError,
    EnsembleConfig,
    GrpcConfig,
    HttpConfig,
    MipConfig,
    MipListener,
    ModelConfig,
    RepositoryConfig,
    ServerConfig,
    ShmConfig,
    TlsConfig,
    TracesConfig,
    read_tokens,
)
from appliance.core.sequences import STRATEGIES
from appliance.formats import repository
from appliance.formats.repository import RepositoryError
from appliance.observability.tracing import LEVELS as TRACE_LEVELS

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")


log = logging.getLogger("appliance.config")


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
    known |= {"tls", "auth", "traces"}
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
        ensembles=served_ensembles,
        auto=(*reader.value("auto", data.get("auto", ()), "tuple[str, ...]"), *reader.auto),
    )
    _check(config, reader)
    return config


CUDA_COPIES = ("model_worker", "frontend")
EVENT_LOOPS = ("uvloop", "asyncio")
MODEL_STARTS = ("zygote", "exec")


def _check(config: ApplianceConfig, reader: Reader) -> None:
    if config.traces.level.upper() not in TRACE_LEVELS:
        reader.fail("traces.level", f"expected one of {', '.join(TRACE_LEVELS)}")
    if config.traces.rate < 1:
        reader.fail("traces.rate", "expected a whole number >= 1 (trace every N-th request)")
    names = [model.name for model in config.models]
    names += [ensemble.name for ensemble in config.ensembles]
    for name in names:
        if names.count(name) > 1:
            reader.fail("models", f"model name {name!r} appears more than once")
    named = [
        ("server.default_model", config.server.default_model),
        ("http.graphpipe_model", config.http.graphpipe_model),
    ]
    named += [
        (f"mip.listeners[{index}].model", listener.model)
        for index, listener in enumerate(config.mip.listeners)
    ]
    for key, value in named:
        if value and value not in names:
            reader.fail(key, f"names model {value!r}, which is not configured")
    if config.shm.inline_threshold_bytes > MAX_INLINE_BYTES:
        reader.fail(
            "shm.inline_threshold_bytes",
            f"must be at most {MAX_INLINE_BYTES} (tensor bytes above 64 KiB never "
            "travel through a socket)",
        )
    if config.shm.cuda_copies not in CUDA_COPIES:
        reader.fail(
            "shm.cuda_copies",
            f'expected "model_worker" or "frontend", got {config.shm.cuda_copies!r}',
        )
    ports = [("http.port", config.http.port), ("grpc.port", config.grpc.port)]
    ports += [
        (f"mip.listeners[{index}].port", listener.port)
        for index, listener in enumerate(config.mip.listeners)
    ]
    for port_key, port in ports:
        if not 0 <= port <= 65535:
            reader.fail(port_key, f"expected a port 0..65535, got {port}")
    _check_http(config.http, reader)
    _check_server(config.server, reader)


def _check_server(server: ServerConfig, reader: Reader) -> None:
    if server.log_level.lower() not in ("debug", "info", "warning", "error"):
        reader.fail("server.log_level", "expected one of debug, info, warning, error")
    if server.event_loop not in EVENT_LOOPS:
        reader.fail(
            "server.event_loop",
            f'expected "uvloop" or "asyncio", got {server.event_loop!r}',
        )
    if server.model_start not in MODEL_STARTS:
        reader.fail(
            "server.model_start",
            f'expected "zygote" or "exec", got {server.model_start!r}',
        )
    if server.access_log not in (True, False, "text", "json"):
        reader.fail(
            "server.access_log",
            f'expected true, false, "text" or "json", got {server.access_log!r}',
        )


def _check_http(http: HttpConfig, reader: Reader) -> None:
    if http.max_body_bytes < 1:
        reader.fail("http.max_body_bytes", "expected an integer >= 1")
    for name in ("read_timeout_s", "io_timeout_s", "keepalive_s"):
        if not getattr(http, name) > 0:
            reader.fail(f"http.{name}", "expected a number of seconds > 0")


class Reader:
    """Check values against the dataclasses' field types, naming keys."""

    def __init__(self, source: str, n_cpus: int = 1) -> None:
        self.source = source
        self.n_cpus = n_cpus
        self.auto: list[str] = []  # the settings resolved from "auto"

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
        """A boolean, or (``strings``) a boolean or a string (checked in _check)."""
        if not isinstance(raw, bool | str) or (isinstance(raw, str) and not strings):
            self.fail(
                key, f"expected true or false{' or a string' if strings else ''}, got {raw!r}"
            )
        return raw

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

    def path(self, key: str, raw: Any) -> str:
        """A file's path; a relative one starts at the config file's directory."""
        text = self.value(key, raw, "str")
        if not text:
            return ""
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = Path(self.source).parent.absolute() / path
        return os.path.normpath(path)

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

    def repositories(self, raw: Any) -> list[RepositoryConfig]:
        if not isinstance(raw, list):
            self.fail("repositories", "expected an array of tables ([[repositories]])")
        found = []
        for index, item in enumerate(raw):
            where = f"repositories[{index}]"
            self.no_extra(item, {"path", "versions", "skip_unavailable"}, where)
            if "path" not in item:
                self.fail(f"{where}.path", "missing; a repository needs the directory's path")
            path = Path(self.value(f"{where}.path", item["path"], "str")).expanduser()
            if not path.is_absolute():
                path = Path(self.source).parent.absolute() / path
            try:
                versions = repository.parse_versions(item.get("versions", "latest"))
            except RepositoryError as ex:
                self.fail(f"{where}.versions", str(ex))
            skip = self.value(
                f"{where}.skip_unavailable", item.get("skip_unavailable", False), "bool"
            )
            found.append(RepositoryConfig(os.path.normpath(path), versions, skip))
        return found

    def repository_models(
        self, repositories: tuple[RepositoryConfig, ...]
    ) -> list[ModelConfig | EnsembleConfig]:
        """Scan each repository; an entry that does not check out is served Broken."""
        models: list[ModelConfig | EnsembleConfig] = []
        for index, repo in enumerate(repositories):
            where = f"repositories[{index}]"
            try:
                entries = repository.scan(Path(repo.path), repo.versions)
            except RepositoryError as ex:
                self.fail(f"{where}.path", str(ex))
            for entry in entries:
                missing = repository.missing_runtime(entry) if repo.skip_unavailable else None
                if missing:
                    log.warning("%s: model %s is left out: %s", where, entry["name"], missing)
                    continue
                if ensembles.is_ensemble(entry):
                    read = ensembles.from_repository(where, entry)
                    models.append(
                        read if isinstance(read, EnsembleConfig) else self.model(where, read)
                    )
                    continue
                try:
                    models.append(self.model(f"{where} model {entry['name']}", entry))
                except ConfigError as ex:
                    reason = str(ex).removeprefix(f"{self.source}: ")
                    models.append(self.model(where, repository.broken(entry["name"], reason)))
        return models

    def models(self, raw: Any) -> list[ModelConfig | EnsembleConfig]:
        if not isinstance(raw, list):
            self.fail("models", "expected an array of tables ([[models]])")
        return [self.entry(f"models[{index}]", entry) for index, entry in enumerate(raw)]

    def entry(self, where: str, data: Any) -> ModelConfig | EnsembleConfig:
        """A [[models]] table: a model class, or an ensemble (one with steps)."""
        if not isinstance(data, Mapping) or not ensembles.is_ensemble(data):
            return self.model(where, data)
        try:
            return ensembles.read(data)
        except ensembles.EnsembleError as ex:
            self.fail(where, f"ensemble {data.get('name')!r}: {ex}")

    def model_limits(self, where: str, data: Mapping[str, Any]) -> tuple[int, float | None]:
        """Read a model's max_queue and max_busy_s."""
        max_queue = self.value(f"{where}.max_queue", data.get("max_queue", 1024), "int")
        if max_queue < 1:
            self.fail(f"{where}.max_queue", f"expected an integer >= 1, got {max_queue}")
        max_busy_s = self.value(f"{where}.max_busy_s", data.get("max_busy_s"), "float | None")
        if max_busy_s is not None and max_busy_s <= 0:
            self.fail(f"{where}.max_busy_s", f"expected a number of seconds > 0, got {max_busy_s}")
        return max_queue, max_busy_s

    def model(self, where: str, data: Any) -> ModelConfig:
        known = {
            "name",
            "class",
            "instances",
            "max_batch_size",
            "max_queue_delay_ms",
            "response_ring_bytes",
            "passthrough",
            "options",
            "max_queue",
            "max_busy_s",
            "restart_wait_s",
            "device",
            "sequence_batching",
            "max_sequence_idle_s",
            "sequence_strategy",
            "max_candidate_sequences",
        }
        self.no_extra(data, known, where)
        for required in ("name", "class"):
            if required not in data:
                self.fail(f"{where}.{required}", "missing; every model needs a name and a class")
        name = self.value(f"{where}.name", data["name"], "str")
        if not _NAME.match(name):
            self.fail(f"{where}.name", f"{name!r}: use 1-63 letters, digits, '_', '.' or '-'")
        cls = self.value(f"{where}.class", data["class"], "str")
        if ":" not in cls:
            self.fail(f"{where}.class", f"expected 'module:Class', got {cls!r}")
        instances = data.get("instances", 1)
        if instances == "auto":
            self.auto.append(f"models.{name}.instances")
            instances = sizing.auto("instances", self.n_cpus)
        instances = self.value(f"{where}.instances", instances, "int")
        if instances < 1:
            self.fail(f"{where}.instances", f"expected an integer >= 1, got {instances}")
        options = data.get("options", {})
        if not isinstance(options, Mapping):
            self.fail(f"{where}.options", "expected a table")
        max_queue, max_busy_s = self.model_limits(where, data)
        restart_wait_s = self.value(
            f"{where}.restart_wait_s", data.get("restart_wait_s", 5.0), "float"
        )
        device = data.get("device", "cpu")
        problem = devices.check(device)
        if problem:
            self.fail(f"{where}.device", problem)
        return ModelConfig(
            name=name,
            cls=cls,
            instances=instances,
            max_batch_size=self.value(
                f"{where}.max_batch_size", data.get("max_batch_size"), "int | None"
            ),
            max_queue_delay_ms=self.value(
                f"{where}.max_queue_delay_ms", data.get("max_queue_delay_ms", 0.0), "float"
            ),
            response_ring_bytes=self.value(
                f"{where}.response_ring_bytes", data.get("response_ring_bytes"), "int | None"
            ),
            passthrough=self.value(f"{where}.passthrough", data.get("passthrough", True), "bool"),
            options=dict(options),
            max_queue=max_queue,
            max_busy_s=max_busy_s,
            restart_wait_s=restart_wait_s,
            device=device,
            **self.sequence_keys(where, data),
        )

    def sequence_keys(self, where: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """Read a model's sequence batching keys (see appliance/core/sequences.py)."""
        idle = self.value(
            f"{where}.max_sequence_idle_s", data.get("max_sequence_idle_s", 60.0), "float"
        )
        if idle <= 0:
            self.fail(f"{where}.max_sequence_idle_s", f"expected seconds > 0, got {idle}")
        strategy = self.value(
            f"{where}.sequence_strategy", data.get("sequence_strategy", "direct"), "str"
        )
        if strategy not in STRATEGIES:
            self.fail(
                f"{where}.sequence_strategy",
                f"expected one of {', '.join(STRATEGIES)}, got {strategy!r}",
            )
        candidates = self.value(
            f"{where}.max_candidate_sequences", data.get("max_candidate_sequences", 1024), "int"
        )
        if candidates < 1:
            self.fail(
                f"{where}.max_candidate_sequences", f"expected an integer >= 1, got {candidates}"
            )
        enabled = data.get("sequence_batching")
        return {
            "sequence_batching": None
            if enabled is None
            else self.value(f"{where}.sequence_batching", enabled, "bool"),
            "max_sequence_idle_s": idle,
            "sequence_strategy": strategy,
            "max_candidate_sequences": candidates,
        }
