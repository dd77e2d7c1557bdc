"""TorchServe's ``config.properties`` (``--ts-config``), read as the flags it means.

TorchServe reads a Java properties file: ``key=value`` (or ``key: value``)
lines, ``#`` and ``!`` comments, a trailing backslash continuing a line.
:func:`as_flags` turns the keys users set into ``appliance serve`` flags
(command_line.py reads them as it reads the command line; a flag given on
the command line wins) and lists what it leaves out:

    inference_address=http://127.0.0.1:8080    --http-address, --http-port
    management_address=http://127.0.0.1:8081   --management-port
    metrics_address=http://127.0.0.1:8082      --metrics-port
    grpc_inference_port=7070                   --grpc-port
    grpc_management_port=7071                  --grpc-management-port
    model_store=/models, load_models=all       --model-store, --models
    max_request_size=6553500                   the HTTP body limit (bytes)
    service_envelope=kservev2                  the envelope around every handler

Keys that mean nothing here (Netty's threads, snapshots, the metrics mode,
...) are :data:`IGNORED` and said once in the log; keys for what the
appliance does not do are refused by name (:data:`REFUSED`, with what to
do instead), as are keys it does not know.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

# Keys that change nothing the appliance does.
IGNORED = {
    "number_of_netty_threads",
    "netty_client_threads",
    "async_logging",
    "enable_metrics_api",
    "metrics_mode",
    "metrics_config",
    # Every metric a handler records is exported, as with it on.
    "model_metrics_auto_detect",
    "metrics_format",
    "enable_envvars_config",
    "vmargs",
    "number_of_gpu",
    "default_workers_per_model",
    "job_queue_size",
    "default_response_timeout",
    "unregister_model_timeout",
    "decode_input_request",
    "max_response_size",
    "enable_model_api",
    "disable_system_metrics",
    "model_snapshot",
    "cpu_launcher_enable",
    "cpu_launcher_args",
    "workflow_store",
    "allowed_urls",
    "use_native_io",
    "io_ratio",
    # The appliance listens on one address, inference_address's.
    "grpc_inference_address",
    "grpc_management_address",
}
REFUSED = {
    "models": "set minWorkers, batchSize and maxBatchDelay in the archive's model-config.yaml",
    "install_py_dep_per_model": "install what a handler needs into the appliance's environment",
    "keystore": "set [tls] cert and key in a config (appliance serve --config)",
    "private_key_file": "set [tls] cert and key in a config (appliance serve --config)",
    "certificate_file": "set [tls] cert and key in a config (appliance serve --config)",
}


# Keys whose value is a flag's, as it is; addresses whose port is a flag's.
FLAG_OF = {
    "grpc_inference_port": "--grpc-port",
    "grpc_management_port": "--grpc-management-port",
    "model_store": "--model-store",
    "disable_token_authorization": "--disable-token-auth",
    "max_request_size": "--max-request-size",
    "service_envelope": "--service-envelope",
}
PORT_OF = {"management_address": "--management-port", "metrics_address": "--metrics-port"}


class PropertiesError(ValueError):
    """A config.properties the appliance cannot take: the message names the key."""


def read(path: Path) -> dict[str, str]:
    """The file's keys and values, as Java's Properties reads them.

    Raises:
        PropertiesError: the file cannot be read.
    """
    try:
        text = path.read_text(encoding="latin-1")
    except OSError as ex:
        raise PropertiesError(f"--ts-config {path}: cannot read it: {ex.strerror}") from None
    found: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = (pending + raw.lstrip()) if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        key, value = _split(line)
        found[key] = value
    if pending:
        key, value = _split(pending)
        found[key] = value
    return found


def _split(line: str) -> tuple[str, str]:
    for index, char in enumerate(line):
        if char in "=:" or char.isspace():
            rest = line[index:].lstrip()
            if rest[:1] in ("=", ":"):
                rest = rest[1:]
            return line[:index], rest.strip()
    return line, ""


def as_flags(properties: dict[str, str], where: Path) -> tuple[dict[str, list[str]], list[str]]:
    """The flags ``properties`` mean, and a note per key left out.

    Raises:
        PropertiesError: a key refused or unknown, or an address that is not a URL.
    """
    flags: dict[str, list[str]] = {}
    notes: list[str] = []
    for key, value in properties.items():
        if key in REFUSED:
            raise PropertiesError(f"--ts-config {where}: {key} is not taken: {REFUSED[key]}")
        if key in IGNORED:
            notes.append(f"--ts-config {where}: {key} is not used by the appliance")
            continue
        if key == "inference_address":
            host, port = _address(key, value, where)
            flags["--http-address"] = [host]
            flags["--http-port"] = [port]
        elif key in PORT_OF:
            flags[PORT_OF[key]] = [_address(key, value, where)[1]]
        elif key in FLAG_OF:
            flags[FLAG_OF[key]] = [value]
        elif key == "load_models":
            flags["--models"] = [item.strip() for item in value.split(",") if item.strip()]
        else:
            raise PropertiesError(
                f"--ts-config {where}: {key} is not a config.properties key the appliance "
                "knows; remove it, or write a config (appliance serve --config)"
            )
    return flags, notes


def _address(key: str, value: str, where: Path) -> tuple[str, str]:
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or parsed.port is None or not parsed.hostname:
        raise PropertiesError(f"--ts-config {where}: {key}={value}: expected http://HOST:PORT")
    if parsed.scheme == "https":
        raise PropertiesError(
            f"--ts-config {where}: {key}={value}: for https, set [tls] cert and key in a "
            "config (appliance serve --config)"
        )
    return parsed.hostname, str(parsed.port)
