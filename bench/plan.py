"""What bench_peers.py measures: payloads, systems, the sweep and its trims.

A *system* is one server spoken to over one protocol by one client: the
appliance over each of its protocols, and each peer over the protocol it
shares with the appliance. Peers name the appliance system they are
compared with (``versus``), so every peer row gets an appliance/peer ratio.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.config import sizing

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
SIZES = {"16B": 16, "16KiB": 16 << 10, "1MiB": MiB, "16MiB": 16 * MiB}
PAYLOADS = ("16B", "16KiB", "1MiB", "16MiB", "digits")

# Concurrency (client processes, one request in flight each) per payload.
# Trimmed so the full run stays near 20 minutes on 2 vCPUs: 64 clients only
# where requests are small (16 B, digits); 16 MiB only at 1 and 4 (64 MiB in
# flight already exceeds the default rings, and the client copies dominate).
FULL_SWEEP: dict[str, tuple[int, ...]] = {
    "16B": (1, 4, 16, 64),
    "16KiB": (1, 16),
    "1MiB": (1, 4, 16),
    "16MiB": (1, 4),
    "digits": (1, 4, 16, 64),
}
# --quick: what the targets need, and digits.
QUICK_SWEEP: dict[str, tuple[int, ...]] = {"16B": (1, 16), "1MiB": (16,), "digits": (1, 16)}
# --quick measures 1 MiB only where a target needs it, and over shared memory.
QUICK_1MIB = {
    "triton grpc",
    "triton rest",
    "triton rest-json",
    "triton shm",
    "kserve-grpc",
    "kserve-rest",
    "kserve-rest-json",
    "kserve-shm",
    "triton shm-rest",
    "kserve-shm-rest",
    "mlserver-pw1 grpc",
    "mlserver-pw1 rest-json",
}
# JSON wires carry 1 MiB of FP32 as 3-5 MB of text, which the Python clients
# take ~0.5 s of CPU to build and parse: 1 MiB up to 4 clients, except the
# pair the 1 MiB REST target compares (16 clients); 16 MiB (40-80 MB
# of text) not at all.
JSON_CAPS = {"16MiB": 0, "1MiB": 4}
JSON_TARGET_CAPS = {"16MiB": 0}
UMBRIDGE_CAPS = {"16MiB": 0, "1MiB": 4}


@dataclass(frozen=True)
class System:
    """A server, the protocol a client speaks to it, and what it is compared with."""

    name: str
    server: str  # "appliance" or a peer's name
    protocol: str  # a key of bench.callers.BUILDERS
    endpoint: str  # which of the server's URLs: grpc, http, mip
    options: dict[str, Any] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)  # payload -> highest concurrency
    versus: str | None = None  # the appliance system a peer is compared with
    more: dict[str, tuple[int, ...]] = field(default_factory=dict)  # payload -> levels added

    def levels(self, payload: str, sweep: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
        cap = self.caps.get(payload, 1 << 30)
        swept = {c for c in sweep.get(payload, ()) if c <= cap}
        if payload in sweep:
            swept |= set(self.more.get(payload, ()))
        return tuple(sorted(swept))


REST_JSON = {"binary": False}
# Issue 55's per-thread cells: 16 B at 1 and 8 clients over KServe REST JSON and gRPC,
# beside Triton and the floors; 8 is added to those systems' sweep alone.
THREAD_CLIENTS = (1, 8)
THREAD_SYSTEMS = ("kserve-rest-json", "kserve-grpc")
EIGHT: dict[str, tuple[int, ...]] = {"16B": (8,)}
# The protocols over HTTP, each also with a new connection per request.
HTTP_PROTOCOLS = ("kserve-rest", "grps-rest", "graphpipe", "umbridge")
NEWCONN_TAG = "newconn"
NEWCONN = {"new_connection": True}
NEWCONN_CAPS = {"16KiB": 0, "1MiB": 0, "16MiB": 0, "digits": 0}
DIRECT_CAPS = {"16KiB": 0, "1MiB": 0, "16MiB": 0, "digits": 0}
APPLIANCE = (
    System("kserve-grpc", "appliance", "kserve-grpc", "grpc", more=EIGHT),
    System("kserve-rest", "appliance", "kserve-rest", "http"),
    System(
        "kserve-rest-json",
        "appliance",
        "kserve-rest",
        "http",
        REST_JSON,
        JSON_TARGET_CAPS,
        more=EIGHT,
    ),
    System("kserve-shm", "appliance", "kserve-shm", "grpc"),
    # The same over REST: no grpc.aio under it.
    System("kserve-shm-rest", "appliance", "kserve-shm-rest", "http"),
    System("grps-rest", "appliance", "grps-rest", "http", caps=JSON_CAPS),
    # GRPS's GenericTensor carries repeated floats: 16 MiB is 4 M list items per side.
    System("grps-grpc", "appliance", "grps-grpc", "grpc", caps={"16MiB": 1}),
    System("graphpipe", "appliance", "graphpipe", "http"),
    System("umbridge", "appliance", "umbridge", "http", caps=UMBRIDGE_CAPS),
    System("mip", "appliance", "mip", "mip"),
    # The process hop alone: the appliance's own client in the load generator,
    # no frontend. Beside the floors, it shows what any protocol adds at least.
    System("direct", "appliance", "direct", "run_dir", caps=DIRECT_CAPS),
    # Clients that open a connection per request, as UM-Bridge's HTTPModel,
    # GraphPipe's remote.execute and curl-style scripts do (bench/callers.py).
    *(
        System(f"{name} {NEWCONN_TAG}", "appliance", name, "http", NEWCONN, NEWCONN_CAPS)
        for name in HTTP_PROTOCOLS
    ),
)
FLOOR_CAPS = {"digits": 0}
HOP_FLOOR_CAPS = {"16B": 1, "16KiB": 0, "1MiB": 0, "16MiB": 0, "digits": 0}
# The falcon floor under every HTTP stack of bench/servers.py FLOOR_KINDS.
FLOORS = ("floor-uvicorn", "floor-asgi", "floor-asgi-uvloop", "floor-gthread", "floor-sync")
PEERS = (
    # Real Triton (tritonserver 2.51, CPU), its models Python-backend model.py files.
    System("triton grpc", "triton", "kserve-grpc", "grpc", versus="kserve-grpc", more=EIGHT),
    System("triton rest", "triton", "kserve-rest", "http", versus="kserve-rest"),
    System(
        "triton rest-json",
        "triton",
        "kserve-rest",
        "http",
        REST_JSON,
        JSON_TARGET_CAPS,
        versus="kserve-rest-json",
        more=EIGHT,
    ),
    System("triton shm", "triton", "kserve-shm", "grpc", versus="kserve-shm"),
    System("triton shm-rest", "triton", "kserve-shm-rest", "http", versus="kserve-shm-rest"),
    System("mlserver-pw1 grpc", "mlserver-pw1", "kserve-grpc", "grpc", versus="kserve-grpc"),
    System(
        "mlserver-pw1 rest-json",
        "mlserver-pw1",
        "kserve-rest",
        "rest",
        REST_JSON,
        JSON_TARGET_CAPS,
        versus="kserve-rest-json",
    ),
    System("mlserver-pw0 grpc", "mlserver-pw0", "kserve-grpc", "grpc", versus="kserve-grpc"),
    System("mlserver-pw4 grpc", "mlserver-pw4", "kserve-grpc", "grpc", versus="kserve-grpc"),
    System(
        "mlserver-pw4 rest-json",
        "mlserver-pw4",
        "kserve-rest",
        "rest",
        REST_JSON,
        JSON_CAPS,
        versus="kserve-rest-json",
    ),
    System(
        "mlserver-pw0 rest-json",
        "mlserver-pw0",
        "kserve-rest",
        "rest",
        REST_JSON,
        JSON_CAPS,
        versus="kserve-rest-json",
    ),
    System(
        "umbridge-ref", "umbridge", "umbridge", "umbridge", caps=UMBRIDGE_CAPS, versus="umbridge"
    ),
    # UM-Bridge's own client as users run it: umbridge.HTTPModel, a connection per call.
    System(
        f"umbridge-ref {NEWCONN_TAG}",
        "umbridge",
        "umbridge",
        "umbridge",
        NEWCONN,
        NEWCONN_CAPS,
        versus=f"umbridge {NEWCONN_TAG}",
    ),
    # The floor on uvicorn's worker at 8 clients too: issue 55's HTTP frontend target.
    *(
        System(
            floor,
            floor,
            "kserve-rest",
            "rest",
            caps=FLOOR_CAPS,
            versus="kserve-rest",
            more=EIGHT if floor == "floor-uvicorn" else {},
        )
        for floor in FLOORS
    ),
    *(
        System(
            f"{floor} {NEWCONN_TAG}",
            floor,
            "kserve-rest",
            "rest",
            NEWCONN,
            NEWCONN_CAPS,
            versus=f"kserve-rest {NEWCONN_TAG}",
        )
        for floor in FLOORS
    ),
    System(
        "floor-grpc-aio",
        "floor-grpc-aio",
        "kserve-grpc",
        "grpc",
        caps=FLOOR_CAPS,
        versus="kserve-grpc",
        more=EIGHT,
    ),
    # The identity cells of issue 55 only: 16 B at 1 and 8 clients.
    System(
        "floor-grpc-aio-hop",
        "floor-grpc-aio-hop",
        "kserve-grpc",
        "grpc",
        caps=HOP_FLOOR_CAPS,
        versus="kserve-grpc",
        more=EIGHT,
    ),
    # The codec's rung: grpc.aio answering through the appliance's pbcodec.
    System(
        "floor-grpc-aio-codec",
        "floor-grpc-aio-codec",
        "kserve-grpc",
        "grpc",
        caps=HOP_FLOOR_CAPS,
        versus="kserve-grpc",
        more=EIGHT,
    ),
    System(
        "floor-grpc-sync",
        "floor-grpc-sync",
        "kserve-grpc",
        "grpc",
        caps=FLOOR_CAPS,
        versus="kserve-grpc",
    ),
)
# The ladder of one request (bench/peers/ladder_app.py), per HTTP protocol,
# at 16 B and one client: each rung adds one layer of the appliance's, the
# whole appliance (the protocol's own row) is the rung above the last.
LADDER_RUNGS = ("floor", "middleware", "codec")
LADDER_CAPS = {"16B": 1, "16KiB": 0, "1MiB": 0, "16MiB": 0, "digits": 0}
# KServe REST with JSON tensors on the floor and codec rungs, at 1 and 8 clients: the
# codec rung of issue 55's HTTP frontend target (the codec rung minus the floor rung).
LADDER_JSON_RUNGS = ("floor", "codec")
# The floor rung with the hop to a process that echoes (peers/hop_echo.py), KServe
# REST JSON at 1 and 8 clients: the least a model worker behind ZeroMQ costs there.
LADDER_HOP_RUNG = "hop"
LADDER = (
    *(
        System(f"ladder-{rung} {name}", f"ladder-{rung}", name, "http", caps=LADDER_CAPS)
        for name in HTTP_PROTOCOLS
        for rung in LADDER_RUNGS
    ),
    *(
        System(
            f"ladder-{rung} kserve-rest-json",
            f"ladder-{rung}",
            "kserve-rest",
            "http",
            REST_JSON,
            LADDER_CAPS,
            more=EIGHT,
        )
        for rung in LADDER_JSON_RUNGS
    ),
    System(
        f"ladder-{LADDER_HOP_RUNG} kserve-rest-json",
        f"ladder-{LADDER_HOP_RUNG}",
        "kserve-rest",
        "http",
        REST_JSON,
        LADDER_CAPS,
        more=EIGHT,
    ),
)
SYSTEMS = {system.name: system for system in (*APPLIANCE, *PEERS, *LADDER)}
# Protocols with no peer that installs here (PEERS.md §5): GRPS ships no
# pip package, GraphPipe's servers are Go binaries, KubeMo is a proof of concept.
NO_PEER = {
    "kserve-shm": "MLServer has no system shared-memory extension",
    "kserve-shm-rest": "MLServer has no system shared-memory extension",
    "grps-rest": "NetEase GRPS has no pip package (PEERS.md §5)",
    "grps-grpc": "NetEase GRPS has no pip package (PEERS.md §5)",
    "graphpipe": "GraphPipe's servers are Go binaries, not on PyPI",
    "mip": "KubeMo's server is a proof of concept (bench_mip.py compares it)",
    "direct": "it is the appliance's own client with no frontend: the hop every protocol adds",
}

# Scaling: (model instances, frontend processes per protocol), each its own appliance.
SCALING = ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4))
SCALING_CELLS = (
    ("kserve-rest", "16B"),
    ("kserve-rest-json", "16B"),
    ("kserve-grpc", "16B"),
    ("kserve-grpc", "digits-unbatched"),
)
SCALING_CLIENTS = 16
# The peers beside the scaling grid: each floor with every frontend count of
# the grid as its worker count, and MLServer with these parallel_workers.
SCALING_FLOORS = ("floor-uvicorn", "floor-asgi", "floor-grpc-aio")
SCALING_MLSERVER_WORKERS = (0, 1, 4)
# With at least this many CPUs the scaling part runs its full grid, the
# server on one half of the CPUs and the load generator on the other.
SCALING_SPLIT_CPUS = 8
SCALING_FULL = tuple((i, f) for f in (1, 2, 4, 8) for i in (1, 2, 4))
SCALING_FULL_CLIENTS = (16, 64, 128)


@dataclass(frozen=True)
class ScalingPlan:
    """The scaling grid this host can run, where each side runs, and why."""

    grid: tuple[tuple[int, int], ...]  # (model instances, frontend processes)
    clients: tuple[int, ...]
    server_cpus: frozenset[int] | None  # None: not pinned
    client_cpus: frozenset[int] | None
    note: str


def scaling_plan(cpus: Sequence[int], grid: str = "") -> ScalingPlan:
    """The full grid with server and load generator on separate CPUs, or a smaller one.

    ``grid`` ("1x1,4x8": instances x frontends) replaces the many-core grid,
    to fit a bounded run.
    """
    ordered = sorted(cpus)
    if len(ordered) >= SCALING_SPLIT_CPUS:
        half = len(ordered) // 2
        server, load = ordered[:half], ordered[half:]
        chosen = SCALING_FULL
        if grid:
            chosen = tuple(
                (int(i), int(f)) for i, f in (cell.split("x") for cell in grid.split(","))
            )
        return ScalingPlan(
            chosen,
            SCALING_FULL_CLIENTS,
            frozenset(server),
            frozenset(load),
            f"{len(ordered)} CPUs: the server pinned to {len(server)} "
            f"(CPUs {server[0]}-{server[-1]}), the load generator to the other {len(load)}",
        )
    return ScalingPlan(
        SCALING,
        (SCALING_CLIENTS,),
        None,
        None,
        f"{len(ordered)} CPUs, fewer than {SCALING_SPLIT_CPUS}: a smaller grid at "
        f"{SCALING_CLIENTS} clients, the load generator sharing the server's CPUs, so past "
        "two busy processes the numbers show the cost of growth, not a speed-up",
    )


# server.event_loop, A and B in the same run (bench_peers ``event_loops``).
EVENT_LOOPS = ("uvloop", "asyncio")
EVENT_LOOP_CELLS = ("kserve-rest", "kserve-grpc", "mip")

BATCHING_CLIENTS = 64
BATCHING_PROTOCOLS = ("kserve-grpc", "mip", "direct")
# Natural batching, the default: a batch is what queued while the last one ran.
BATCH_DELAY_MS = 0.0
# The batching part's models: payload -> (batched model, unbatched model).
CALL_COST_MS = 2.0
BATCHING_MODELS = {
    "digits": ("digits", "digits_unbatched"),
    "digits-2ms": ("digits_2ms", "digits_2ms_unbatched"),
}
# Equal offered load: this share of the slower server's closed-loop 16-client rate.
PACED_SHARE = 0.7


def payload_spec(payload: str) -> dict[str, Any]:
    if payload.startswith("digits"):
        kind = payload.removesuffix("-unbatched")
        batched, unbatched = BATCHING_MODELS[kind]
        return {"model": "digits", "served_as": unbatched if kind != payload else batched}
    return {"model": "identity", "nbytes": SIZES[payload]}


def spec_for(system: System, payload: str, endpoints: dict[str, Any]) -> dict[str, Any]:
    """The caller spec (bench.callers) for ``system`` at ``payload``."""
    spec: dict[str, Any] = {"protocol": system.protocol, **system.options}
    spec.update(payload_spec(payload))
    where = endpoints[system.server]
    if system.protocol == "umbridge" and payload in SIZES:
        spec["served_as"] = f"umb_identity_{payload}"
    if system.endpoint == "mip":
        spec["host"], spec["port"] = "127.0.0.1", where["mip"][spec.get("served_as", spec["model"])]
    else:
        spec["url"] = where[system.endpoint]
    if system.protocol == "direct":
        spec["run_dir"] = where["run_dir"]
    return spec


def appliance_sections(frontends: int | None = None) -> dict[str, Any]:
    """Config sections as `make run` has them (appliance/default.toml), ports 0.

    Access logs are off here, as they are for every peer.
    """
    defaults = tomllib.loads((ROOT / "appliance" / "default.toml").read_text())
    sections: dict[str, Any] = {"server": {"access_log": False}}
    for name in ("http", "grpc", "mip", "shm"):
        skip = ("port", "listeners", "graphpipe_model")
        table = {k: v for k, v in defaults[name].items() if k not in skip}
        if frontends is not None and name in ("http", "grpc", "mip"):
            table["workers"] = frontends
        elif table.get("workers") == "auto":
            # As the appliance would size it here; the floors get the same count.
            table["workers"] = sizing.auto(f"{name}.workers", sizing.usable_cpus())
        sections[name] = table
    served = ("identity", *(m for pair in BATCHING_MODELS.values() for m in pair))
    listeners = [{"port": 0, "model": m} for m in served]
    sections["mip"]["listeners"] = listeners
    return sections


def appliance_models(instances: int = 1, umbridge: bool = True) -> list[dict[str, Any]]:
    """identity and digits as in default.toml, digits unbatched, digits with a fixed cost
    per call (batched and not), and UM-Bridge's identities."""
    models: list[dict[str, Any]] = [
        {
            "name": "identity",
            "class": "appliance.demos.identity:Identity",
            "response_ring_bytes": 128 * MiB,
        },
        {
            "name": "digits",
            "class": "appliance.demos.digits:Digits",
            "max_batch_size": 64,
            "max_queue_delay_ms": BATCH_DELAY_MS,
        },
        {"name": "digits_unbatched", "class": "appliance.demos.digits:Digits", "max_batch_size": 0},
    ]
    slow = {
        "class": "bench.peers.appliance_models:CallCostDigits",
        "options": {"call_ms": CALL_COST_MS},
    }
    models += [
        {"name": "digits_2ms", **slow, "max_batch_size": 64, "max_queue_delay_ms": BATCH_DELAY_MS},
        {"name": "digits_2ms_unbatched", **slow, "max_batch_size": 0},
    ]
    for label, nbytes in SIZES.items():
        if umbridge and label != "16MiB":
            models.append(
                {
                    "name": f"umb_identity_{label}",
                    "class": "bench.peers.appliance_models:FixedIdentity",
                    "options": {"size": nbytes // 4},
                }
            )
    for model in models:
        model["instances"] = instances
    return models
