"""``appliance serve --model-repository DIR``: tritonserver's command line, read as a config.

A Triton user starts a server with ``tritonserver --model-repository=models``
and a handful of flags. ``appliance serve`` takes the same line and turns it
into the config those flags mean (:func:`config`), so a Triton repository
serves with no TOML written: HTTP on 8000, gRPC on 8001, /metrics alone on
8002, every model of the repositories, Triton's readiness and exit timeout. Flags with
no meaning here (the backend directory, GPU metrics) are taken and
ignored; any other tritonserver flag is refused by name, with what to use
instead where there is something.

Both ``--flag=value`` and ``--flag value`` are read, as tritonserver reads
them; booleans are true/false (also 1/0, on/off, yes/no).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from appliance.formats.mlserver import settings as mlserver_settings
from appliance.formats.torchserve import properties as torchserve_properties
from appliance.formats.torchserve import store as torchserve_store

REPOSITORY_FLAGS = ("--model-repository", "--model-store")
# Any of these makes `appliance serve` read the line as tritonserver's (or torchserve's).
SERVE_FLAGS = (*REPOSITORY_FLAGS, "--ts-config")
# Flag -> what it sets, for the --help text.
TAKEN = {
    "--model-repository, --model-store": "a Triton repository or MLServer folder (repeatable)",
    "--http-port": "HTTP (KServe REST, /metrics, ...): default 8000 (MLServer folder: 8080)",
    "--grpc-port": "gRPC (KServe gRPC): default 8001 (MLServer folder: 8081)",
    "--metrics-port": "/metrics alone: default 8002 (MLServer folder: 8082)",
    "--http-address, --grpc-address": "the address both listen on (one for both)",
    "--model-control-mode": "none (serve every model) or explicit (those --load-model names)",
    "--load-model": "explicit mode: a model served from the start (repeat; * for all)",
    "--strict-readiness": "true: ready once every model is (the appliance's readiness)",
    "--exit-timeout-secs": "how long a stop waits for requests in flight (default 30)",
    "--log-verbose": "above 0: debug logs",
    "--allow-http, --allow-grpc": "true only: every protocol is served",
    "--allow-metrics": "false: no metrics port (/metrics stays on the HTTP port)",
    "--exit-on-error": "taken; a model that fails to load never stops the appliance",
    "--cache-config": "local,size=N: the response cache's bytes, per frontend process",
    "--backend-directory, --backend-config, --allow-gpu-metrics, --cache-directory": "ignored",
    "--models": "a TorchServe model store's archives: all, NAME=FILE.mar, FILE.mar (several)",
    "--management-port": "a TorchServe model store's management API: default 8081",
    "--grpc-management-port": "its gRPC management port: default 7071",
    "--ts-config": "torchserve's config.properties (addresses, model_store, load_models)",
    "--service-envelope": "kserve or kservev2: TorchServe's envelope around every handler",
    "--ncs, --foreground, --enable-model-api": "torchserve's; taken",
    "--disable-token-auth": "a model store's calls need no key (else: key_file.json)",
}
# torchserve's flags without a value.
SWITCHES = {"--ncs", "--no-config-snapshots", "--foreground", "--start"}
SWITCHES |= {"--disable-token-auth", "--enable-model-api"}
# The table config() adds when a model store's keys are to be written (cli.py writes
# them, and names the tokens file in [auth]).
TOKEN_AUTH = "torchserve_token_auth"
# Where `torchserve` listens: inference (and management here) on 8080, gRPC 7070, metrics 8082.
TORCHSERVE_PORTS = {"http_port": 8080, "grpc_port": 7070, "metrics_port": 8082}
MANAGEMENT_PORT = 8081
GRPC_MANAGEMENT_PORT = 7071
IGNORED = {"--backend-directory", "--allow-gpu-metrics", "--exit-on-error", "--backend-config"}
IGNORED |= {"--cache-directory"}
# Refused with what to do instead.
RELOAD = "reload with `appliance ctl reload` (or SIGHUP) after a change"
NOT_STRICT = "the appliance is ready once every served model is"
INSTEAD = {
    "--repository-poll-secs": RELOAD,
    "--disable-auto-complete-config": "the appliance always completes a partial config",
}
_TRUE = {"true", "1", "on", "yes"}
_FALSE = {"false", "0", "off", "no"}


class FlagError(ValueError):
    """A tritonserver flag the appliance does not take, or a bad value."""


def help_text() -> str:
    rows = [f"  {flag:<44} {what}" for flag, what in TAKEN.items()]
    return "tritonserver flags taken with --model-repository:\n" + "\n".join(rows)


def parse(argv: Sequence[str]) -> dict[str, list[str]]:
    """tritonserver's flags as flag -> its values, in order.

    Raises:
        FlagError: an argument that is not a ``--flag``, or a flag without a value.
    """
    flags: dict[str, list[str]] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--"):
            raise FlagError(f"{arg!r}: expected a tritonserver --flag")
        flag, has_value, value = arg.partition("=")
        if flag in SWITCHES and not has_value:
            flags.setdefault(flag, []).append("true")
            continue
        if flag == "--models" and not has_value:
            # torchserve takes several archives after one --models.
            while args and not args[0].startswith("--"):
                flags.setdefault(flag, []).append(args.pop(0))
            if flag not in flags:
                raise FlagError("--models: needs a value (all, NAME=FILE.mar or FILE.mar)")
            continue
        if not has_value:
            if args and not args[0].startswith("--"):
                value = args.pop(0)
            elif flag not in INSTEAD:  # those are refused below, with or without a value
                raise FlagError(f"{flag}: needs a value ({flag}=VALUE)")
        flags.setdefault(flag, []).append(value)
    return flags


def config(argv: Sequence[str], notes: list[str] | None = None) -> dict[str, Any]:
    """The config (as the TOML reader's tables) that tritonserver's flags mean
    (or torchserve's, with its config.properties); ``notes`` gets what was left out.

    Raises:
        FlagError: a flag the appliance does not take, or a value it cannot.
    """
    flags = parse(argv)
    body_limit = _ts_config(flags, notes if notes is not None else [])
    for flag in flags:
        if flag in INSTEAD:
            raise FlagError(f"{flag} is not taken: {INSTEAD[flag]}")
        if flag not in _KNOWN:
            raise FlagError(
                f"{flag}: not a tritonserver flag appliance serve takes (see --help for "
                "those it does; for the rest, write a config: --config)"
            )
    repositories = [str(Path(p).resolve()) for f in REPOSITORY_FLAGS for p in flags.get(f, [])]
    if not repositories:
        raise FlagError("--model-repository: at least one is needed")
    # An MLServer folder listens where `mlserver start` would: its settings.json
    # or MLServer's ports (8080, 8081, 8082), unless a flag says otherwise.
    ports = mlserver_settings.listening([Path(p) for p in repositories])
    models = flags.get("--models", [])
    management: dict[str, Any] = {}
    grpc_management: dict[str, Any] = {}
    token_auth = False
    if models or any(torchserve_store.is_model_store(Path(p)) for p in repositories):
        token_auth = not any(
            _bool("--disable-token-auth", v) for v in flags.get("--disable-token-auth", [])
        )
        ports = {**TORCHSERVE_PORTS, **ports}
        management["management_port"] = _port(flags, "--management-port", MANAGEMENT_PORT)
        grpc_management["management_port"] = _port(
            flags, "--grpc-management-port", GRPC_MANAGEMENT_PORT
        )
    else:
        for flag in ("--management-port", "--grpc-management-port"):
            if flag in flags:
                raise FlagError(f"{flag}: only a TorchServe model store has a management API")
    server = {"default_model": "", **_listening(flags, ports), **_control(flags), **_cache(flags)}
    if "--exit-timeout-secs" in flags:
        server["drain_timeout_s"] = float(_number(flags, "--exit-timeout-secs"))
    if "--log-verbose" in flags:
        server["log_level"] = "debug" if _number(flags, "--log-verbose") > 0 else "info"
    tables: dict[str, Any] = {
        "server": server,
        "http": {
            "port": _port(flags, "--http-port", ports.get("http_port", 8000)),
            "graphpipe_model": "",
            **_metrics(flags, ports.get("metrics_port", 8002)),
            **management,
            **body_limit,
        },
        "grpc": {
            "port": _port(flags, "--grpc-port", ports.get("grpc_port", 8001)),
            **grpc_management,
        },
        # Triton has no MIP (and its metrics port is 8002, MIP's default).
        "mip": {"listeners": []},
        "repositories": [
            {"path": path, **({"models": models} if models else {}), **_envelope(flags)}
            for path in repositories
        ],
    }
    if token_auth:
        tables[TOKEN_AUTH] = {}
    return tables


def _envelope(flags: dict[str, list[str]]) -> dict[str, Any]:
    """The repository key of TorchServe's service_envelope (checked by the config's reader)."""
    values = flags.get("--service-envelope")
    return {"envelope": values[-1]} if values else {}


def _ts_config(flags: dict[str, list[str]], notes: list[str]) -> dict[str, Any]:
    """Merge ``--ts-config``'s flags into ``flags`` (those given win); the http keys
    it sets that no flag names (the body limit)."""
    if "--ts-config" not in flags:
        return {}
    path = Path(flags.pop("--ts-config")[-1])
    try:
        from_file, left_out = torchserve_properties.as_flags(torchserve_properties.read(path), path)
    except torchserve_properties.PropertiesError as ex:
        raise FlagError(str(ex)) from None
    notes += left_out
    limit = from_file.pop("--max-request-size", None)
    if "--model-store" in from_file and any(f in flags for f in REPOSITORY_FLAGS):
        del from_file["--model-store"]
    for flag, values in from_file.items():
        flags.setdefault(flag, values)
    if limit is None:
        return {}
    return {"max_body_bytes": _number({"max_request_size": limit}, "max_request_size")}


def _listening(flags: dict[str, list[str]], ports: dict[str, Any]) -> dict[str, Any]:
    """The server keys of the address and allow-protocol flags."""
    for flag in ("--allow-http", "--allow-grpc"):
        if not all(_bool(flag, value) for value in flags.get(flag, [])):
            raise FlagError(f"{flag}=false is not taken: the appliance serves every protocol")
    addresses = {a for f in ("--http-address", "--grpc-address") for a in flags.get(f, [])}
    if len(addresses) > 1:
        raise FlagError(
            f"--http-address and --grpc-address differ ({', '.join(sorted(addresses))}): "
            "the appliance listens on one address for every protocol"
        )
    if not addresses and "host" in ports:
        addresses.add(str(ports["host"]))
    return {"host": addresses.pop()} if addresses else {}


def _metrics(flags: dict[str, list[str]], default: int) -> dict[str, Any]:
    """The http keys of the metrics flags: a metrics port of its own, as Triton's."""
    if not all(_bool("--allow-metrics", value) for value in flags.get("--allow-metrics", [])):
        return {}
    return {"metrics_port": _port(flags, "--metrics-port", default)}


def _control(flags: dict[str, list[str]]) -> dict[str, Any]:
    """The server keys of model control and readiness."""
    for value in flags.get("--strict-readiness", []):
        if not _bool("--strict-readiness", value):
            raise FlagError(f"--strict-readiness=false is not taken: {NOT_STRICT}")
    mode = (flags.get("--model-control-mode") or ["none"])[-1]
    if mode == "poll":
        raise FlagError(f"--model-control-mode=poll is not taken: {RELOAD}")
    if mode not in ("none", "explicit"):
        raise FlagError(f"--model-control-mode={mode}: expected none, explicit (or poll)")
    loads = flags.get("--load-model", [])
    if loads and mode != "explicit":
        raise FlagError("--load-model needs --model-control-mode=explicit, as in tritonserver")
    return {"load_models": loads} if mode == "explicit" else {}


def toml_text(tables: dict[str, Any]) -> str:
    """``tables`` (of :func:`config`: strings, numbers, lists of them) as TOML."""
    lines = []
    for name, table in tables.items():
        rows = table if isinstance(table, list) else [table]
        for row in rows:
            lines.append(f"[[{name}]]" if isinstance(table, list) else f"[{name}]")
            lines += [f"{key} = {_toml_value(value)}" for key, value in row.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


_KNOWN = {
    *REPOSITORY_FLAGS,
    *IGNORED,
    *SWITCHES,
    "--ts-config",
    "--models",
    "--service-envelope",
    "--management-port",
    "--grpc-management-port",
    "--http-port",
    "--grpc-port",
    "--http-address",
    "--grpc-address",
    "--model-control-mode",
    "--load-model",
    "--strict-readiness",
    "--exit-timeout-secs",
    "--log-verbose",
    "--allow-http",
    "--allow-grpc",
    "--allow-metrics",
    "--metrics-port",
    "--cache-config",
}


def _cache(flags: dict[str, list[str]]) -> dict[str, Any]:
    """--cache-config local,size=N: the response cache's bytes (per frontend process)."""
    found: dict[str, Any] = {}
    for value in flags.get("--cache-config", []):
        kind, _, setting = value.partition(",")
        key, _, size = setting.partition("=")
        if kind != "local":
            raise FlagError(
                f"--cache-config={value}: the appliance's cache is local (local,size=N)"
            )
        if key != "size" or not size.isdigit():
            raise FlagError(f"--cache-config={value}: expected local,size=N (N bytes)")
        found["response_cache_bytes"] = int(size)
    return found


def _bool(flag: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise FlagError(f"{flag}={value}: expected true or false")


def _number(flags: dict[str, list[str]], flag: str) -> int:
    value = flags[flag][-1]
    try:
        number = int(value)
    except ValueError:
        raise FlagError(f"{flag}={value}: expected a whole number") from None
    if number < 0:
        raise FlagError(f"{flag}={value}: expected a whole number >= 0")
    return number


def _port(flags: dict[str, list[str]], flag: str, default: int) -> int:
    if flag not in flags:
        return default
    port = _number(flags, flag)
    if port > 65535:
        raise FlagError(f"{flag}={port}: expected a port, 0 to 65535")
    return port
