"""The appliance's configuration: TOML in, frozen dataclasses out.

Every value is checked once, when read (``config_reader.py``); an error
names the file, the key and what was expected, e.g. ``config.toml:
models[1].instances: expected an integer >= 1, got 0``. The master hands
children a JSON snapshot of the resolved configuration (:func:`to_dict` /
:func:`from_dict`), so a child never sees a file that changed on disk after
the master read it.

``[[repositories]]`` name model repositories (see ``appliance/repository.py``):
:func:`load` scans them and adds their models to ``models`` as ordinary
entries, so a snapshot carries the versions the master chose.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from appliance.repository import VersionPolicy

DEFAULT_CONFIG = Path(__file__).with_name("default.toml")
MiB = 1 << 20
MAX_INLINE_BYTES = 64 * 1024


class ConfigError(ValueError):
    """The configuration is invalid; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    run_dir: str = ""
    start_online: bool = True
    grace_s: float = 1.0
    drain_timeout_s: float = 30.0
    stop_timeout_s: float = 10.0
    default_model: str = ""
    log_level: str = "info"
    python_path: tuple[str, ...] = ()
    spin_wait_us: int = 200
    # True (or "text"): one text line per request; "json": JSON lines; False: none.
    access_log: bool | str = True


@dataclass(frozen=True, slots=True)
class HttpConfig:
    port: int = 8000
    workers: int = 2
    # Per worker, for the routes that block (see protocols/web.py); requests
    # waiting on a model hold none.
    threads: int = 8
    # Every REST protocol refuses a larger body (413), from Content-Length
    # before reading it when the client sends one.
    max_body_bytes: int = 64 * MiB
    # Slow clients: a request's headers (and a body up to 1 MiB) must arrive
    # within read_timeout_s; each read of a larger body and each write of a
    # response may wait io_timeout_s; an idle connection closes after keepalive_s.
    read_timeout_s: float = 30.0
    io_timeout_s: float = 60.0
    keepalive_s: int = 30


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    port: int = 8001
    workers: int = 1
    threads: int = 8
    max_message_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class MipListener:
    """One MIP port and the model it serves ("" = server.default_model)."""

    port: int
    model: str = ""
    # With [auth] on, MIP (which cannot carry a token) is refused unless trusted.
    trusted: bool = False


@dataclass(frozen=True, slots=True)
class MipConfig:
    """MIP listeners and the limits each MIP process applies per connection."""

    workers: int = 1
    listeners: tuple[MipListener, ...] = (MipListener(8002),)
    max_frame_bytes: int = 64 * MiB
    read_timeout_s: float = 30.0
    idle_timeout_s: float = 120.0
    max_connections: int = 1024


@dataclass(frozen=True, slots=True)
class ShmConfig:
    request_ring_bytes: int = 32 * MiB
    response_ring_bytes: int = 32 * MiB
    inline_threshold_bytes: int = 16 * 1024
    max_tensor_bytes: int = 1 << 30
    spill_limit_bytes: int = 2 << 30


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for HTTP and gRPC: PEM files, absolute once read ("" = plain TCP)."""

    cert: str = ""
    key: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Bearer-token auth on every protocol: a file of tokens ("" = off), absolute once read."""

    tokens_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.tokens_file)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    cls: str
    instances: int = 1
    max_batch_size: int | None = None
    max_queue_delay_ms: float = 0.0
    response_ring_bytes: int | None = None
    passthrough: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)
    # Requests an instance holds queued before it answers Overloaded.
    max_queue: int = 1024
    # The master kills an instance busy this long in one batch (None: never).
    max_busy_s: float | None = None


@dataclass(frozen=True, slots=True)
class RepositoryConfig:
    """A model repository (see appliance/repository.py) and its version policy.

    ``versions`` is "latest", "all" or the version numbers to serve; a
    model's own config.toml may set another. ``path`` is absolute once read.
    """

    path: str
    versions: VersionPolicy = "latest"


@dataclass(frozen=True, slots=True)
class ApplianceConfig:
    source: str
    server: ServerConfig
    http: HttpConfig
    grpc: GrpcConfig
    mip: MipConfig
    shm: ShmConfig
    models: tuple[ModelConfig, ...]
    repositories: tuple[RepositoryConfig, ...] = ()
    tls: TlsConfig = TlsConfig()
    auth: AuthConfig = AuthConfig()

    def mip_model(self, listener: MipListener) -> str:
        """The model a MIP listener serves: its own, the default, or the first."""
        if listener.model:
            return listener.model
        if self.server.default_model:
            return self.server.default_model
        return self.models[0].name if self.models else ""

    def model(self, name: str) -> ModelConfig | None:
        for model in self.models:
            if model.name == name:
                return model
        return None

    def resolved_run_dir(self) -> Path:
        if self.server.run_dir:
            return Path(self.server.run_dir)
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if runtime:
            return Path(runtime) / "appliance"
        return Path(f"/tmp/appliance-{os.getuid()}")


# -- loading ------------------------------------------------------------------


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
    # config_reader builds this module's dataclasses, so it imports this module.
    from appliance.config_reader import build

    return build(data, source, scan_repositories)


# The [[models]] keys a load may override (``appliance ctl``'s and KServe's load).
OVERRIDABLE = ("instances", "max_batch_size", "max_queue_delay_ms")


def with_overrides(model: ModelConfig, overrides: Mapping[str, Any]) -> ModelConfig:
    """Return ``model`` with ``overrides`` (keys of :data:`OVERRIDABLE`) applied and checked.

    Raises:
        ConfigError: a key is not overridable, or a value is invalid.
    """
    from appliance.config_reader import Reader

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


def to_dict(config: ApplianceConfig) -> dict[str, Any]:
    """Return a JSON-able mapping that :func:`from_dict` reads back."""
    data = dataclasses.asdict(config)
    data["models"] = [
        {("class" if key == "cls" else key): value for key, value in model.items()}
        for model in data["models"]
    ]
    data["server"]["python_path"] = list(config.server.python_path)
    data["mip"]["listeners"] = [dataclasses.asdict(item) for item in config.mip.listeners]
    data["repositories"] = [dataclasses.asdict(item) for item in config.repositories]
    return data


def read_tokens(path: Path) -> list[str]:
    """Read an auth tokens file: one token a line; blank lines and # comments skipped.

    Raises:
        ValueError: unreadable, no token, or a line with whitespace inside.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as ex:
        raise ValueError(f"cannot read {path}: {ex}") from None
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        if any(char.isspace() for char in token):
            raise ValueError(f"{path} line {number}: a token may not contain whitespace")
        tokens.append(token)
    if not tokens:
        raise ValueError(f"{path} holds no token (one per line; # starts a comment)")
    return tokens


def write_snapshot(config: ApplianceConfig, path: Path) -> None:
    """Write the resolved config as JSON for the children to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.write_bytes(orjson.dumps(to_dict(config), option=orjson.OPT_INDENT_2))
    temp.replace(path)


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
