"""The checks of a built config that no single field's type can make.

Choices among a few strings, ranges, ports, and the names that must be those
of configured models (a model twice, a default or listener's model that is
none): checked once every section is read, on the built ApplianceConfig,
so each failure still names its key. Apart from the reader (reader.py),
which reads each value; these see the whole.
"""

from __future__ import annotations

from appliance.config.settings import MAX_INLINE_BYTES, ApplianceConfig, HttpConfig, ServerConfig
from appliance.config.value_reader import ValueReader
from appliance.observability.tracing import LEVELS as TRACE_LEVELS

CUDA_COPIES = ("model_worker", "frontend")
EVENT_LOOPS = ("uvloop", "asyncio")
MODEL_STARTS = ("zygote", "exec")


def check(config: ApplianceConfig, reader: ValueReader) -> None:
    """Check the built ``config``; ``reader`` names the file and key of a failure.

    Raises:
        ConfigError: a value is invalid, or names a model not configured.
    """
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
    _check_openai(config, reader)


def _check_openai(config: ApplianceConfig, reader: ValueReader) -> None:
    prefix = config.openai.prefix
    if not prefix.startswith("/") or prefix.rstrip("/") in ("", "/v2") or " " in prefix:
        reader.fail(
            "openai.prefix",
            f'expected a path such as "/v1" (not "/" or KServe\'s "/v2"), got {prefix!r}',
        )
    if config.openai.default_max_tokens < 1:
        reader.fail("openai.default_max_tokens", "expected a whole number >= 1")


def _check_server(server: ServerConfig, reader: ValueReader) -> None:
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


def _check_http(http: HttpConfig, reader: ValueReader) -> None:
    if http.max_body_bytes < 1:
        reader.fail("http.max_body_bytes", "expected an integer >= 1")
    for name in ("read_timeout_s", "io_timeout_s", "keepalive_s"):
        if not getattr(http, name) > 0:
            reader.fail(f"http.{name}", "expected a number of seconds > 0")
