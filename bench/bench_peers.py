"""End to end against peers: every protocol, Triton, MLServer, UM-Bridge and a falcon floor.

One run, one machine, one load generator (bench/loadgen.py: client
processes, each a closed loop with one request in flight, for a fixed time):

1. Load: ``identity`` at 16 B, 16 KiB, 1 MiB and 16 MiB and ``digits`` (a
   batch of 1) over KServe gRPC, REST (binary and JSON tensors) and system
   shared memory (tritonclient), GRPS REST and gRPC, GraphPipe, UM-Bridge and
   MIP, at 1, 4, 16 and 64 clients (trimmed: bench/plan.py says where; 16 B
   at 8 clients too over KServe REST JSON and gRPC, on Triton and on their
   floors and the ladder's REST JSON rungs: issue 55's per-thread cells).
2. Peers in the same run, each in its own virtual environment under
   bench/.peers/ (made on first use): real Triton (tritonserver 2.51 from
   the nvidia-pytriton wheel, CPU; ``identity`` and ``digits`` as Python-backend
   model.py files, bench/peers/python_backend/) over KServe gRPC, REST
   (binary and JSON) and system shared memory; MLServer 1.7.1 with parallel_workers 1
   and 0 over V2 REST and gRPC (same tritonclient load), UM-Bridge's own
   server, and a bare falcon+gunicorn app that answers in place under each
   HTTP stack gunicorn can drive (uvicorn's worker class, the appliance's;
   gunicorn's ASGI worker on asyncio and on uvloop; gthread and sync for
   reference). Ratios appliance/peer per row. Every HTTP protocol, the floors
   and UM-Bridge's server (with its own client, umbridge.HTTPModel) also with
   a new connection per request; and the ladder of one request
   (bench/peers/ladder_app.py: the floor on the appliance's worker, plus its
   middleware, plus each protocol's codec), whose next rung is the appliance.
3. Event loops: an appliance with ``server.event_loop`` "uvloop" and one
   with "asyncio", back to back, over KServe REST, gRPC and MIP at 16 B.
   Batching: digits at 64 clients, dynamic batching on (max_batch_size 64,
   natural batching) and off (max_batch_size 0), over KServe gRPC, MIP and the internal
   client.
4. Scaling (bench/plan.py ``scaling_plan``): on a host with 8 CPUs or more,
   1, 2, 4, 8 frontend processes per protocol x 1, 2, 4 model instances at
   16, 64 and 128 clients, the server pinned to half the CPUs and the load
   generator to the other half (``os.sched_setaffinity``); on a smaller host
   1, 2 and 4 instances, and 1, 2 and 4 frontends, at 16 clients, sharing
   CPUs. The note beside the table says which ran. Beside the grid, on the
   same CPUs: the ASGI and grpc.aio floors with each frontend count of the
   grid as their workers, and MLServer with parallel_workers 0, 1 and 4.
5. Results: bench/results/peers.json (peers-quick.json with --quick,
   peers-scaling.json with --scaling-only; ``-<N>core`` added on a host with
   8 CPUs or more), bench/results/peers.png (latency against throughput;
   matplotlib in bench/.peers/plot), and the tables in docs/performance.md
   (full runs; a many-core host's --scaling-only run writes its own table).
6. The issue's targets, printed as met / MISSED with the values.

Server CPU per request (psutil, the server's whole process tree) is in every
row: the Python load generator shares the 2 vCPUs, so throughput understates
what the server alone could do. Every row also has it by thread kind
(``threads_us``) and by process (``processes_us``; bench/threads.py), and
each repeat of the load grid measures the hop's floor (bench/bench_hop_floor.py:
ZeroMQ alone, 1 and 8 in flight), so the identity cells of KServe REST JSON
and gRPC at 1 and 8 clients get a table thread by thread beside Triton's, the
floors' and the hop's (bench/thread_tables.py). Usage::

    python bench/bench_peers.py [--quick] [--seconds S] [--repeats R]
                                [--no-scaling | --scaling-only]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import itertools
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers, peers_results, report, servers, triton_peer  # noqa: E402
from bench.bench_hop_floor import measure_apart  # noqa: E402
from bench.loadgen import ClientPool, ProcessTree  # noqa: E402
from bench.plan import (  # noqa: E402
    APPLIANCE,
    BATCHING_CLIENTS,
    BATCHING_MODELS,
    BATCHING_PROTOCOLS,
    EVENT_LOOP_CELLS,
    EVENT_LOOPS,
    FULL_SWEEP,
    LADDER,
    LADDER_HOP_RUNG,
    LADDER_RUNGS,
    PACED_SHARE,
    PAYLOADS,
    PEERS,
    QUICK_1MIB,
    QUICK_SWEEP,
    SCALING_CELLS,
    SCALING_FLOORS,
    SCALING_MLSERVER_WORKERS,
    SIZES,
    SYSTEMS,
    THREAD_CLIENTS,
    ScalingPlan,
    System,
    appliance_models,
    appliance_sections,
    scaling_plan,
    spec_for,
)
from tests.system.harness import running  # noqa: E402

STARTED = time.monotonic()
# What the run needs after the load grid: paced, batching, scaling, plot.
RESERVE_S = 200.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 2 minutes: fewer cells")
    parser.add_argument("--seconds", type=float, help="per measurement (1.0; quick 0.5)")
    parser.add_argument("--repeats", type=int, help="repeats of everything (3; quick 1)")
    parser.add_argument("--no-scaling", action="store_true", help="skip the scaling part")
    parser.add_argument("--no-peers", action="store_true", help="the appliance alone")
    parser.add_argument(
        "--scaling-only", action="store_true", help="only the scaling part and its peers"
    )
    parser.add_argument(
        "--budget-min",
        type=float,
        default=20.0,
        help="the whole run's bound: no further repeat of the load grid starts if it would "
        "end past it (the other parts take about 3 minutes)",
    )
    args = parser.parse_args()
    args.seconds = args.seconds or (0.5 if args.quick else 1.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    record: dict[str, Any] = {
        "args": vars(args),
        "peers": {},
        "rows": [],
        "paced": [],
        "batching": [],
        "scaling": [],
        "event_loops": [],
        "hop_floor": [],
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "grid_repeats": 0,
        "grid_repeat_s": 0.0,
        "date": datetime.date.today().isoformat(),
    }
    began = time.monotonic()
    grid = os.environ.get("BENCH_SCALING_GRID", "")  # "1x1,4x8": a bounded run's grid
    scaling = scaling_plan(sorted(os.sched_getaffinity(0)), grid)
    record["scaling_note"] = scaling.note
    size = BATCHING_CLIENTS if args.no_scaling else max(BATCHING_CLIENTS, *scaling.clients)
    clients = ClientPool(size, callers.make_call, preload=callers.PRELOAD, method="forkserver")
    # A run stopped from outside (`timeout`, a device call's limit) still
    # writes what it measured, marked as cut short.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with clients as pool:
            print(f"{pool.size} client processes up ({time.monotonic() - began:.0f} s)")
            if not args.scaling_only:
                main_phase(pool, args, record)
                event_loops(pool, args, record)
            if not args.no_scaling:
                scaling_phase(pool, args, record, scaling)
    except KeyboardInterrupt:
        record["cut_short"] = True
        log("stopped: writing what was measured so far")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    record["elapsed_s"] = time.monotonic() - began
    peers_results.finish(args, record)
    return 0


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def log(text: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.0f} s] {text}", flush=True)


def appliance_endpoints(appliance: Any) -> dict[str, Any]:
    ports = appliance.ports
    return {
        "grpc": f"127.0.0.1:{ports['grpc']}",
        "http": f"127.0.0.1:{ports['http']}",
        "mip": {x["model"]: int(x["port"]) for x in appliance.state["mip_listeners"]},
        "run_dir": str(appliance.run_dir),
    }


def peer_factories(run_dir: str) -> dict[str, Callable[[], Any]]:
    """Every peer, by name; the ladder's rungs attach to the appliance at ``run_dir``."""
    sections = appliance_sections()
    http, grpc = sections["http"], sections["grpc"]
    sizes = {label: n // 4 for label, n in SIZES.items() if label != "16MiB"}
    factories: dict[str, Callable[[], Any]] = {
        "mlserver-pw1": lambda: servers.mlserver(1),
        "mlserver-pw0": lambda: servers.mlserver(0),
        "umbridge": lambda: servers.umbridge_server(sizes),
        "triton": triton_peer.bench_models,
    }
    for kind in servers.FLOOR_KINDS:
        threads = http["threads"] if kind == "gthread" else 1
        factories[f"floor-{kind}"] = functools.partial(
            servers.floor, kind, http["workers"], threads
        )
    factories["floor-grpc-aio"] = lambda: servers.grpc_floor("aio", grpc["workers"], 1)
    factories["floor-grpc-aio-hop"] = lambda: servers.grpc_floor("aio-hop", grpc["workers"], 1)
    factories["floor-grpc-aio-codec"] = lambda: servers.grpc_floor("aio-codec", grpc["workers"], 1)
    factories["floor-grpc-sync"] = lambda: servers.grpc_floor(
        "sync", grpc["workers"], grpc["threads"]
    )
    for rung in (*LADDER_RUNGS, LADDER_HOP_RUNG):
        factories[f"ladder-{rung}"] = functools.partial(
            servers.ladder, rung, run_dir, http["workers"]
        )
    return factories


@contextlib.contextmanager
def everything(args: argparse.Namespace, record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The appliance and every peer that starts: endpoints and process trees by server."""
    with contextlib.ExitStack() as stack:
        appliance = stack.enter_context(running(appliance_models(), **appliance_sections()))
        record["appliance"] = {"sections": appliance_sections(), "models": appliance_models()}
        where = {"appliance": appliance_endpoints(appliance), "client": appliance.client()}
        trees = {"appliance": ProcessTree(appliance.process.pid)}
        log("appliance up")
        factories = peer_factories(str(appliance.run_dir))
        for name, factory in ({} if args.no_peers else factories).items():
            try:
                server = stack.enter_context(factory())
            except servers.PeerUnavailable as error:
                record["peers"][name] = {"available": False, "reason": str(error)}
                log(f"peer {name} unavailable: {error}")
                continue
            record["peers"][name] = {"available": True, "details": server.details}
            where[name], trees[name] = server.urls, server.tree
            log(f"peer {name} up")
        yield {"where": where, "trees": trees}


def main_phase(pool: ClientPool, args: argparse.Namespace, record: dict[str, Any]) -> None:
    sweep = QUICK_SWEEP if args.quick else FULL_SWEEP
    deadline = STARTED + args.budget_min * 60 - RESERVE_S
    with everything(args, record) as servers_up:
        where, trees = servers_up["where"], servers_up["trees"]
        systems = [s for s in (*APPLIANCE, *PEERS, *LADDER) if s.server in where]
        try:
            for repeat in range(args.repeats):
                began = time.monotonic()
                if repeat and began + record["grid_repeat_s"] > deadline:
                    log(f"load grid: {repeat} repeat(s); another would pass --budget-min")
                    break
                # The shared machine drifts over minutes: every other repeat
                # runs the systems backwards, so drift weighs on all alike.
                ordered = systems if repeat % 2 == 0 else systems[::-1]
                for payload in PAYLOADS:
                    for system in ordered:
                        levels = system.levels(payload, sweep)
                        if args.quick and payload == "1MiB" and system.name not in QUICK_1MIB:
                            continue
                        if levels:
                            spec = spec_for(system, payload, where)
                            for concurrency in levels:
                                row = pool.measure(
                                    spec, concurrency, args.seconds, trees[system.server]
                                )
                                record["rows"].append(tagged(row, system, payload, repeat))
                            pool.release()
                    log(f"repeat {repeat + 1}/{args.repeats}: {payload} done")
                hop_floor(args, record, repeat)
                record["grid_repeats"] = repeat + 1
                record["grid_repeat_s"] = time.monotonic() - began
            paced(pool, args, record, where, trees)
            batching(pool, args, record, where, trees)
        finally:
            pool.release()


def hop_floor(args: argparse.Namespace, record: dict[str, Any], repeat: int) -> None:
    """The hop's floor (ZeroMQ alone) at the per-thread cells' client counts, in this
    repeat, so its threads stand beside the appliance's measured in the same minutes."""
    for inflight in THREAD_CLIENTS:
        try:
            row = measure_apart("zmq", inflight, args.seconds)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            log(f"hop floor, {inflight} in flight: {error}")
            continue
        record["hop_floor"].append(row | {"repeat": repeat})


def tagged(row: dict[str, Any], system: System, payload: str, repeat: int) -> dict[str, Any]:
    if row["errors"]:
        print(f"  {system.name} {payload} c={row['concurrency']}: {row['error']}")
    return {
        "system": system.name,
        "server": system.server,
        "payload": payload,
        "repeat": repeat,
    } | row


def paced(
    pool: ClientPool,
    args: argparse.Namespace,
    record: dict[str, Any],
    where: dict[str, Any],
    trees: dict[str, ProcessTree],
) -> None:
    """p99 at equal offered load: 16 clients paced at a share of the slower server's rate."""
    summary = report.summarise(record["rows"])
    for ours, theirs in (
        ("kserve-grpc", ("mlserver-pw1 grpc", "mlserver-pw0 grpc")),
        ("kserve-rest-json", ("mlserver-pw1 rest-json", "mlserver-pw0 rest-json")),
    ):
        group = [SYSTEMS[ours], *(SYSTEMS[n] for n in theirs if SYSTEMS[n].server in where)]
        rates = [report.cell(summary, s.name, "16B", 16) for s in group[:2]]
        if len(group) < 2 or None in rates:
            continue
        rate = PACED_SHARE * min(row["rps"] for row in rates if row)
        for repeat in range(args.repeats):
            for system in group:
                spec = spec_for(system, "16B", where)
                row = pool.measure(spec, 16, args.seconds * 2, trees[system.server], rate=rate)
                record["paced"].append(tagged(row, system, "16B", repeat))
            pool.release()
    log("paced done")


def batching(
    pool: ClientPool,
    args: argparse.Namespace,
    record: dict[str, Any],
    where: dict[str, Any],
    trees: dict[str, ProcessTree],
) -> None:
    """digits (and digits with a fixed cost per call) at 64 clients, batched (64 rows,
    2 ms) and unbatched, per protocol."""
    endpoint = {"kserve-grpc": "grpc", "mip": "mip", "direct": "run_dir"}
    payloads = [p for kind in BATCHING_MODELS for p in (kind, f"{kind}-unbatched")]
    for repeat in range(args.repeats):
        for protocol in BATCHING_PROTOCOLS:
            system = System(protocol, "appliance", protocol, endpoint[protocol])
            for payload in payloads:
                spec = spec_for(system, payload, where)
                model = spec["served_as"]
                before = counters(where["client"], model)
                row = pool.measure(spec, BATCHING_CLIENTS, args.seconds, trees["appliance"])
                row |= batch_figures(before, counters(where["client"], model))
                record["batching"].append(tagged(row, system, payload, repeat))
            pool.release()
    log("batching done")


def event_loops(pool: ClientPool, args: argparse.Namespace, record: dict[str, Any]) -> None:
    """server.event_loop A/B: the appliance on uvloop and on asyncio's loop, back to back
    (the order alternating between repeats, two at least: A B B A), at 16 B over HTTP,
    gRPC and MIP."""
    models = appliance_models(umbridge=False)
    for repeat in range(max(2, args.repeats)):
        kinds = EVENT_LOOPS if repeat % 2 == 0 else EVENT_LOOPS[::-1]
        for kind in kinds:
            sections = appliance_sections()
            sections["server"] = {**sections["server"], "event_loop": kind}
            with running(models, **sections) as appliance:
                where = {"appliance": appliance_endpoints(appliance)}
                tree = ProcessTree(appliance.process.pid)
                try:
                    for name, clients in itertools.product(EVENT_LOOP_CELLS, (1, 16)):
                        spec = spec_for(SYSTEMS[name], "16B", where)
                        row = pool.measure(spec, clients, args.seconds, tree)
                        row = tagged(row, SYSTEMS[name], "16B", repeat)
                        record["event_loops"].append(row | {"event_loop": kind})
                    pool.release()
                finally:
                    pool.release()
    log("event loops done")


def counters(client: Any, model: str) -> dict[str, int]:
    return {counter.name: value for counter, value in client.counters(model).items()}


def batch_figures(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Rows per batch, and the worker's compute and queue time, from its counters."""
    delta = {key: after[key] - before[key] for key in before}
    batches, rows, done = delta["BATCHES"], delta["BATCH_ROWS"], delta["SUCCESS"]
    return {
        "rows_per_batch": rows / batches if batches else math.nan,
        "compute_us_per_row": delta["COMPUTE_NS"] / rows / 1e3 if rows else math.nan,
        "queue_us_per_request": delta["QUEUE_NS"] / done / 1e3 if done else math.nan,
    }


def scaling_phase(
    pool: ClientPool, args: argparse.Namespace, record: dict[str, Any], plan: ScalingPlan
) -> None:
    """Throughput with more model instances and more frontend processes (``plan``)."""
    log(f"scaling: {plan.note}")
    if plan.client_cpus:
        for process in pool.processes:
            if process.pid:
                os.sched_setaffinity(process.pid, plan.client_cpus)
    server_cpus = set(plan.server_cpus) if plan.server_cpus else None
    for instances, frontends in plan.grid:
        models = appliance_models(instances, umbridge=False)
        sections = appliance_sections(frontends)
        with running(models, affinity=server_cpus, **sections) as appliance:
            where = {"appliance": appliance_endpoints(appliance)}
            tree = ProcessTree(appliance.process.pid)
            try:
                for repeat in range(args.repeats):
                    for (name, payload), clients in itertools.product(SCALING_CELLS, plan.clients):
                        spec = spec_for(SYSTEMS[name], payload, where)
                        row = pool.measure(spec, clients, args.seconds, tree)
                        row = tagged(row, SYSTEMS[name], payload, repeat)
                        record["scaling"].append(
                            row | {"instances": instances, "frontends": frontends}
                        )
                    pool.release()
            finally:
                pool.release()
        log(f"scaling: {instances} instance(s), {frontends} frontend(s) done")
    scaling_peers(pool, args, record, plan)


def scaling_peers(
    pool: ClientPool, args: argparse.Namespace, record: dict[str, Any], plan: ScalingPlan
) -> None:
    """The floors with each frontend count of the grid as their workers, and MLServer
    with each of SCALING_MLSERVER_WORKERS, on the server's CPUs at the grid's clients."""
    # (system names, their server, frontends, instances) per peer started.
    runs: list[tuple[tuple[str, ...], Callable[[], Any], int, int]] = []
    for frontends in sorted({f for _instances, f in plan.grid}):
        for name in SCALING_FLOORS:
            runs.append(((name,), lambda n=name, f=frontends: floor_server(n, f), frontends, 1))
    for workers in SCALING_MLSERVER_WORKERS:
        names = (f"mlserver-pw{workers} grpc", f"mlserver-pw{workers} rest-json")
        runs.append((names, lambda w=workers: servers.mlserver(w), 1, workers))
    for names, factory, frontends, instances in runs:
        try:
            with contextlib.ExitStack() as stack:
                with pinned(plan.server_cpus):
                    server = stack.enter_context(factory())
                where = {SYSTEMS[names[0]].server: server.urls}
                for repeat in range(args.repeats):
                    for name, clients in itertools.product(names, plan.clients):
                        spec = spec_for(SYSTEMS[name], "16B", where)
                        row = pool.measure(spec, clients, args.seconds, server.tree)
                        row = tagged(row, SYSTEMS[name], "16B", repeat)
                        record["scaling"].append(
                            row | {"instances": instances, "frontends": frontends}
                        )
                    pool.release()
        except servers.PeerUnavailable as error:
            log(f"scaling: {names[0]} unavailable: {error}")
            continue
        finally:
            pool.release()
        log(f"scaling: {', '.join(names)} ({frontends} worker(s), {instances} instance(s)) done")


def floor_server(name: str, workers: int) -> Any:
    """A floor of SCALING_FLOORS with ``workers`` processes of one thread."""
    if name == "floor-grpc-aio":
        return servers.grpc_floor("aio", workers, 1)
    return servers.floor(name.removeprefix("floor-"), workers, 1)


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """Start what the block starts on ``cpus`` (children inherit this process's affinity)."""
    if cpus is None:
        yield
        return
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, everything)


if __name__ == "__main__":
    sys.exit(main())
