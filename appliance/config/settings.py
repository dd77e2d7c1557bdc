"""The appliance's configuration: TOML in, frozen dataclasses out.

Every value is checked once, when read (``config_reader.py``); an error
names the file, the key and what was expected, e.g. ``config.toml:
models[1].instances: expected an integer >= 1, got 0``. The master hands
children a JSON snapshot of the resolved configuration (:func:`to_dict` /
:func:`from_dict`), so a child never sees a file that changed on disk after
the master read it.

``[[repositories]]`` name model repositories (see ``appliance/formats/repository.py``):
:func:`load` scans them and adds their models to ``models`` as ordinary
entries, so a snapshot carries the versions the master chose.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

# Which versions of a repository's model serve: "latest", "all", or the numbers given.
VersionPolicy = str | tuple[int, ...]


DEFAULT_CONFIG = Path(__file__).parent.parent / "default.toml"
MiB = 1 << 20
MAX_INLINE_BYTES = 64 * 1024


class ConfigError(ValueError):
    """The configuration is invalid; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    # The address every listener (HTTP, gRPC, MIP) binds; "0.0.0.0" for all.
    host: str = "127.0.0.1"
    run_dir: str = ""
    # Ready as soon as every model is; false: out of rotation until `appliance ctl online`.
    start_online: bool = True
    grace_s: float = 1.0
    drain_timeout_s: float = 30.0
    stop_timeout_s: float = 10.0
    # The model a request that names none goes to (GRPS, a MIP listener
    # without a model, GraphPipe's root URL); "" = none for GRPS and the
    # first model for MIP.
    default_model: str = ""
    # debug, info, warning or error, for every process.
    log_level: str = "info"
    # Directories model workers add to sys.path before importing a model's class.
    python_path: tuple[str, ...] = ()
    spin_wait_us: int = 200
    # The threads that only carry requests (ZeroMQ's I/O threads, grpcio's) under
    # SCHED_BATCH: appliance/processes/helper_threads.py. Off by default: on a host
    # whose CPUs other work keeps busy, the helpers wait for them.
    helper_threads_batch: bool = False
    # True (or "text"): one text line per request; "json": JSON lines; False: none.
    access_log: bool | str = True
    # The CPUs "auto" sizes for (appliance/config/sizing.py); 0 reads them from the
    # process's affinity and cgroup quota. A snapshot holds the number found.
    cpus: int = 0
    # The asyncio loop of every frontend process (HTTP workers, gRPC, MIP):
    # "uvloop" (libuv's) or "asyncio" (the standard library's).
    event_loop: str = "uvloop"
    # How model workers start: "zygote" (forked from one warm process that has
    # imported numpy, pyzmq and the worker's code, so idle models share those
    # pages) or "exec" (a fresh interpreter each, as every other child).
    model_start: str = "zygote"
    # The models served from the start ("*": all). The others are known (the
    # repository index lists them) and served once a load names them, as
    # tritonserver's --model-control-mode=explicit with --load-model.
    load_models: tuple[str, ...] = ("*",)
    # Bytes of answers each frontend process keeps for the models that ask for
    # a response cache (response_cache = true); 0: no cache.
    response_cache_bytes: int = 0


@dataclass(frozen=True, slots=True)
class HttpConfig:
    # KServe REST, GRPS REST, GraphPipe, UM-Bridge, /metrics and the dashboard (0: any free port).
    port: int = 8000
    # A port of its own that answers /metrics alone, as Triton's metrics port
    # (8002) does (0: any free port); none: /metrics is on the HTTP port only.
    metrics_port: int | None = None
    # A port of its own that answers TorchServe's management API alone (/models,
    # as its port 8081 does; 0: any free port); none: the HTTP port answers it.
    management_port: int | None = None
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
    # The longest wait for each read of a larger body and each write of a reply.
    io_timeout_s: float = 60.0
    # An idle keep-alive connection closes after this many seconds.
    keepalive_s: int = 30
    # KServe REST compresses a response (when the client accepts gzip or
    # deflate) from this size on: a smaller one costs more to compress than it saves.
    compress_min_bytes: int = 1024
    # The model GraphPipe's root URL serves ("" = server.default_model).
    graphpipe_model: str = ""


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    # KServe gRPC and GRPS gRPC (0: any free port).
    port: int = 8001
    # A second port every gRPC service answers on, as TorchServe's management
    # port (7071) for a model store (0: any free port); none: the one port.
    management_port: int | None = None
    # gRPC processes, all accepting on the port the master holds.
    workers: int = 1
    threads: int = 8
    # The largest message received or sent; beyond it a call ends RESOURCE_EXHAUSTED.
    max_message_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class MipListener:
    """One MIP port and the model it serves ("" = server.default_model)."""

    # The TCP port.
    port: int
    # The model every request on the port goes to ("" = server.default_model).
    model: str = ""
    # With [auth] on, MIP (which cannot carry a token) is refused unless trusted.
    trusted: bool = False


@dataclass(frozen=True, slots=True)
class MipConfig:
    """MIP listeners and the limits each MIP process applies per connection."""

    # MIP processes; each serves every listener.
    workers: int = 1
    # An empty array: no MIP (no port, no process).
    listeners: tuple[MipListener, ...] = (MipListener(8002),)
    max_frame_bytes: int = 64 * MiB
    read_timeout_s: float = 30.0
    idle_timeout_s: float = 120.0
    max_connections: int = 1024


@dataclass(frozen=True, slots=True)
class ShmConfig:
    request_ring_bytes: int = 32 * MiB
    response_ring_bytes: int = 32 * MiB
    # Where /dev/shm has less free space than the rings above need (a
    # container's 64 MiB default), the master caps every ring at an equal
    # share of it, down to min_ring_bytes; false: it refuses to start instead.
    shrink_to_fit: bool = True
    # The smallest ring shrink_to_fit makes; tensors larger than a ring go
    # into one-off segments while /dev/shm has room for them.
    min_ring_bytes: int = 1 * MiB
    inline_threshold_bytes: int = 16 * 1024
    # A tensor larger than a ring goes into a one-off segment up to this size;
    # a larger one fails its request with an error that names this key.
    max_tensor_bytes: int = 1 << 30
    spill_limit_bytes: int = 2 << 30
    # Who reads and writes KServe CUDA shared memory: "model_worker" (on its
    # GPU, device to device) or "frontend" (through host memory; each
    # frontend process then holds a CUDA context on every GPU it serves).
    cuda_copies: str = "model_worker"


@dataclass(frozen=True, slots=True)
class OpenAIConfig:
    """OpenAI's routes on the HTTP port (appliance/protocols/openai/)."""

    # Where the routes live: {prefix}/chat/completions, {prefix}/models, ...
    prefix: str = "/v1"
    # A tokenizer directory for every model without one of its own (its chat
    # template and token counts); "": none.
    tokenizer: str = ""
    # Sent as max_tokens when a request gives none (Triton's --default-max-tokens).
    default_max_tokens: int = 16


@dataclass(frozen=True, slots=True)
class TracesConfig:
    """Request traces (appliance/observability/tracing.py): where spans go, and the
    starting settings.

    ``level``, ``rate`` and ``max_traces`` are Triton's trace_level,
    trace_rate and trace_count (0: unlimited); the trace extension's API
    changes them at run time.
    """

    level: str = "OFF"
    rate: int = 1000
    # Traces left to take, per frontend process (0: unlimited).
    max_traces: int = 0
    # OTLP/HTTP traces endpoint; "" uses OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or the default.
    url: str = ""
    # Spans go out in batches this often.
    export_ms: int = 1000

    def initial(self) -> dict[str, Any]:
        """These values as Triton's trace settings."""
        return {
            "trace_level": [self.level.upper()],
            "trace_rate": str(self.rate),
            "trace_count": str(self.max_traces or -1),
        }


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for HTTP and gRPC: PEM files, absolute once read ("" = plain TCP)."""

    cert: str = ""
    # The private key (PEM); refused when others may read it.
    key: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Bearer-token auth on every protocol: a file of tokens ("" = off), absolute once read."""

    # One token a line (# comments), or TorchServe's key_file.json (each key opens its own
    # API until it expires); refused when others may read it; re-read when it changes.
    tokens_file: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.tokens_file)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    # The name clients call it by: 1-63 letters, digits, '_', '.' or '-'.
    name: str
    # "module:Class", a subclass of appliance.model.Model (see server.python_path).
    cls: str
    # Processes serving it, one instance each ("auto": one per 4 CPUs, 1..16);
    # requests go to the least loaded.
    instances: int = 1
    # Rows per batch, overriding the class's (0: no batching); larger requests are split.
    max_batch_size: int | None = None
    # "cpu", "cuda" (instance i on GPU i mod count) or "cuda:N"; see appliance/config/device.py.
    device: str = "cpu"
    # An extra wait for a batch to fill (0: natural batching, no wait).
    max_queue_delay_ms: float = 0.0
    # The instance's response ring (None: sized to the model's declared outputs).
    response_ring_bytes: int | None = None
    # Outputs that are views of inputs are answered without a copy.
    passthrough: bool = True
    # Passed to the model's constructor.
    options: Mapping[str, Any] = field(default_factory=dict)
    # Requests an instance holds queued before it answers Overloaded.
    max_queue: int = 1024
    # The master kills an instance busy this long in one batch (None: never).
    max_busy_s: float | None = None
    # How long a request waits for an instance that is (re)starting.
    restart_wait_s: float = 5.0
    # Stateful sequences (worker/sequences.py); None: as the model class declares.
    sequence_batching: bool | None = None
    max_sequence_idle_s: float = 60.0
    sequence_strategy: str = "direct"
    max_candidate_sequences: int = 1024


# A tensor an ensemble declares: (name, dtype, whole shape with -1 for any size).
Declared = tuple[str, str, tuple[int, ...]]
ENSEMBLE = "ensemble"


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step of an ensemble: a served model and the ensemble tensors it reads and makes.

    As in Triton's ``ensemble_scheduling.step``: ``input_map`` maps each of
    the model's input names to the ensemble tensor it reads, ``output_map``
    each of its output names to the ensemble tensor it becomes.
    """

    # The served model the step calls.
    model: str
    # The model's input name -> the ensemble tensor it reads.
    input_map: Mapping[str, str]
    # The model's output name -> the ensemble tensor it makes.
    output_map: Mapping[str, str]
    # The version asked for (-1: the one served); ``model`` is already the
    # served model that answers for it (``<name>.v<N>`` for an older one).
    version: int = -1


@dataclass(frozen=True, slots=True)
class EnsembleConfig:
    """A graph of steps served under one name; it has no worker process of its own.

    Its inputs and outputs are declared (Triton requires them), so its
    metadata is known without asking a step. See appliance/client/ensemble.py.
    """

    # The name clients call it by.
    name: str
    # The ensemble's inputs, each with its whole shape (-1: any size).
    inputs: tuple[Declared, ...]
    # Its outputs, declared the same way; each is an input or a step's output.
    outputs: tuple[Declared, ...]
    # The graph's steps, in any order: each runs once its inputs are made.
    steps: tuple[EnsembleStep, ...]
    # Reported in its model config; above 0, every shape starts with the batch dimension -1.
    max_batch_size: int = 0
    # Reported in its metadata.
    description: str = ""
    # The version it reports.
    version: str = "1"

    def to_table(self) -> dict[str, Any]:
        """The ``[[models]]`` table that declares this ensemble (for a snapshot)."""
        return {
            "name": self.name,
            "platform": ENSEMBLE,
            "max_batch_size": self.max_batch_size,
            "description": self.description,
            "version": self.version,
            "inputs": [_declared_table(item) for item in self.inputs],
            "outputs": [_declared_table(item) for item in self.outputs],
            "steps": [
                {
                    "model": step.model,
                    "version": step.version,
                    "input_map": dict(step.input_map),
                    "output_map": dict(step.output_map),
                }
                for step in self.steps
            ],
        }


def _declared_table(item: Declared) -> dict[str, Any]:
    return {"name": item[0], "dtype": item[1], "shape": list(item[2])}


@dataclass(frozen=True, slots=True)
class RepositoryConfig:
    """A model repository (see appliance/formats/repository.py), its version policy, and
    whether models whose runtime is not installed are left out.

    ``versions`` is "latest", "all" or the version numbers to serve; a
    model's own config.toml may set another. ``path`` is absolute once read.
    """

    # The directory of model directories (relative: from the config file's directory).
    path: str
    # "latest", "all" or an array of version numbers; a model's config.toml may override it.
    versions: VersionPolicy = "latest"
    # Leave out models whose runtime's package is not installed, with a warning,
    # instead of serving them as failed (which keeps the host from being ready).
    skip_unavailable: bool = False
    # A TorchServe model store: the archives served, as its --models names them
    # ("all", "NAME=FILE.mar", "FILE.mar"); empty: all of them.
    models: tuple[str, ...] = ()
    # A TorchServe model store: its service_envelope around every handler, "kserve"
    # (KServe v1's instances) or "kservev2" (KServe v2's inputs); "": none.
    envelope: str = ""


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
    traces: TracesConfig = TracesConfig()
    openai: OpenAIConfig = OpenAIConfig()
    # Ensembles, from [[models]] tables with steps and from repositories: no
    # process serves one, so they are kept apart from ``models``.
    ensembles: tuple[EnsembleConfig, ...] = ()
    # The settings that were "auto" (sizing.py), e.g. "http.workers" or
    # "models.digits.instances": their numbers above were derived from server.cpus.
    auto: tuple[str, ...] = ()

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

    def ensemble(self, name: str) -> EnsembleConfig | None:
        for ensemble in self.ensembles:
            if ensemble.name == name:
                return ensemble
        return None

    def resolved_run_dir(self) -> Path:
        if self.server.run_dir:
            return Path(self.server.run_dir)
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if runtime:
            return Path(runtime) / "appliance"
        return Path(f"/tmp/appliance-{os.getuid()}")


# -- snapshots ----------------------------------------------------------------


def to_dict(config: ApplianceConfig) -> dict[str, Any]:
    """Return a JSON-able mapping that :func:`from_dict` reads back."""
    data = dataclasses.asdict(config)
    data["models"] = [
        {("class" if key == "cls" else key): value for key, value in model.items()}
        for model in data["models"]
    ]
    # An ensemble is read back as the [[models]] table it came from.
    del data["ensembles"]
    data["models"] += [ensemble.to_table() for ensemble in config.ensembles]
    data["server"]["python_path"] = list(config.server.python_path)
    data["mip"]["listeners"] = [dataclasses.asdict(item) for item in config.mip.listeners]
    data["repositories"] = [dataclasses.asdict(item) for item in config.repositories]
    return data


def write_snapshot(config: ApplianceConfig, path: Path) -> None:
    """Write the resolved config as JSON for the children to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.write_bytes(orjson.dumps(to_dict(config), option=orjson.OPT_INDENT_2))
    temp.replace(path)
