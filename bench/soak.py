"""Soak: moderate load on every protocol for a while; resources must not grow.

Starts an appliance (HTTP, gRPC and MIP workers sized to the host, as by
default; ``faulty`` with 2 instances and ``identity``), then runs the stock
clients of every protocol in loops (tests/system/traffic.py: KServe REST and
gRPC, GRPS, GraphPipe, UM-Bridge, MIP with small tensors, and KServe REST and
gRPC with 256 KiB tensors). Every ``--sample-s`` it samples, per process of
the tree: RSS (``appliance ctl status``) and open fds (/proc/<pid>/fd, each
with what it is), and the tree's /dev/shm usage (the sizes of
``appliance-<tree>-*``).

What a process holds grows at first and then stops: each frontend process
opens its channels to the model instances as its threads first call them,
and each instance its sockets back. So the warm-up first brings every
process to its steady state: bursts of concurrent calls over many
connections per protocol (so that every frontend process gets some, and
each of its threads reaches every instance) are repeated until a whole
burst opens no fd anywhere (at most MAX_BURSTS). The measured part follows,
three quarters of ``--minutes``. Its first and last windows (each a quarter
of it) are compared: fds by their least count in the window (an fd open for
a moment, such as the sampler's own control connection, is no growth), RSS
and shm bytes by their median. The run fails
if any of them grew by more than ``--max-growth`` (5 %), naming for fds
what the new ones are (a TCP peer, a unix socket's path, an eventfd...), if
the warm-up never steadied, if any process was restarted, or if any call
failed or hung. The table goes to stdout, every sample's counts to
``--out`` (bench/results/soak.json). Usage::

    python bench/soak.py [--minutes 10] [--sample-s S] [--pace-s 0.04] [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.system import traffic  # noqa: E402
from tests.system.harness import Appliance, demo_models, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "soak.json"
LARGE = (1, 64 << 10)  # FP32: 256 KiB a tensor
BURST_CALLS = 30
SAMPLE_BURST_S = 0.2
MAX_BURSTS = 6
# The part of --minutes measured after the warm-up (which takes what it needs).
MEASURED = 0.75
MEDIAN_OF = 3


class KserveRestLarge(traffic.KserveRest):
    protocol = "kserve-rest-256k"

    def __init__(self, ep: traffic.Endpoints) -> None:
        super().__init__(ep)
        self.model = "identity"

    def __call__(self, x: traffic.Array) -> traffic.Array:
        tensor = self.lib.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        result = self.client.infer(self.model, [tensor])
        return np.asarray(result.as_numpy("OUTPUT0"))

    @staticmethod
    def example(rng: np.random.Generator) -> traffic.Array:
        return rng.standard_normal(LARGE).astype(np.float32)

    @staticmethod
    def expected(x: traffic.Array) -> traffic.Array:
        return x


class KserveGrpcLarge(traffic.KserveGrpc):
    protocol = "kserve-grpc-256k"

    def __init__(self, ep: traffic.Endpoints) -> None:
        super().__init__(ep)
        self.model = "identity"

    def __call__(self, x: traffic.Array) -> traffic.Array:
        tensor = self.lib.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = self.client.infer(self.model, [tensor], client_timeout=traffic.DEADLINE_S)
        return np.asarray(result.as_numpy("OUTPUT0"))

    example = KserveRestLarge.example
    expected = KserveRestLarge.expected


CALLERS: tuple[type[traffic.Caller], ...] = (
    *traffic.EVERY_PROTOCOL,
    KserveRestLarge,
    KserveGrpcLarge,
)


def config() -> dict[str, Any]:
    faulty = {
        "name": "faulty",
        "class": "tests.system.faulty:Faulty",
        "instances": 2,
        "max_busy_s": 10.0,
    }
    return {
        "models": [faulty, *demo_models("identity")],
        "http": {"workers": "auto", "threads": 8},
        "grpc": {"workers": "auto", "threads": 8},
        "mip": {"workers": "auto", "listeners": [{"port": 0, "model": "faulty"}]},
        "shm": {"request_ring_bytes": 16 << 20, "response_ring_bytes": 16 << 20},
    }


# -- sampling ---------------------------------------------------------------------

TCP_STATES = {"01": "established", "06": "time-wait", "08": "close-wait", "0A": "listening"}
UNIX_LISTENING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags


def fd_targets(pid: int) -> dict[int, str] | None:
    """What each open fd of ``pid`` refers to (readlink), or None once it is gone."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    targets = {}
    for name in names:
        with contextlib.suppress(OSError):  # closed meanwhile
            targets[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return targets


def socket_table() -> dict[str, str]:
    """Say what each TCP and unix socket of this host is, by its ``socket:[inode]``."""
    table = {}
    for kind in ("tcp", "tcp6"):
        for fields in _proc_net(kind):
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            where = f"{_address(local)} -> {_address(remote)}"
            table[f"socket:[{inode}]"] = f"{kind} {where} {TCP_STATES.get(state, state)}"
    for fields in _proc_net("unix"):
        inode, path = fields[6], fields[7] if len(fields) > 7 else "(unnamed)"
        listening = "listening " if int(fields[3], 16) & UNIX_LISTENING else ""
        table[f"socket:[{inode}]"] = f"unix {listening}{path}"
    return table


def _proc_net(kind: str) -> list[list[str]]:
    try:
        lines = Path(f"/proc/net/{kind}").read_text().splitlines()[1:]
    except OSError:
        return []
    return [line.split() for line in lines]


def _address(text: str) -> str:
    host, port = text.split(":")
    if len(host) == 8:  # IPv4, in the kernel's byte order
        return f"{socket.inet_ntoa(bytes.fromhex(host)[::-1])}:{int(port, 16)}"
    return f"[...]:{int(port, 16)}"


def shm_bytes(tree: str) -> tuple[int, int]:
    """Total size and count of the tree's /dev/shm files."""
    sizes = []
    for path in Path("/dev/shm").glob(f"appliance-{tree}-*"):
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            continue
    return sum(sizes), len(sizes)


def process_key(process: dict[str, Any]) -> str:
    """A process's name in the table: its role, with the pid for gunicorn's workers."""
    role = str(process["role"])
    return f"{role} {process['pid']}" if role == "http worker" else role


def sample(appliance: Appliance, started: float) -> dict[str, Any]:
    """Every process's RSS, fds and what they are, and the tree's shm.

    ``targets`` (not written to --out) maps each process to its fds'
    targets, sockets described by /proc/net, read after the fds so that
    every socket listed is there.
    """
    raw = {}
    for process in appliance.processes():
        pid = process["pid"]
        if not pid or process.get("rss_bytes") is None:
            continue  # a slot whose process is gone
        raw[process_key(process)] = (pid, process["rss_bytes"], fd_targets(pid))
    sockets = socket_table()
    processes, targets = {}, {}
    for key, (pid, rss, fds) in raw.items():
        processes[key] = {"pid": pid, "rss": rss, "fds": None if fds is None else len(fds)}
        if fds is not None:
            targets[key] = [sockets.get(target, target) for target in fds.values()]
    shm, segments = shm_bytes(appliance.tree)
    return {
        "t": round(time.monotonic() - started, 2),
        "processes": processes,
        "shm_bytes": shm,
        "shm_files": segments,
        "targets": targets,
    }


# -- judging ----------------------------------------------------------------------


def series(samples: list[dict[str, Any]]) -> Iterator[tuple[str, str, str]]:
    """Every measured quantity: (name, process or "", what)."""
    yield "shm bytes", "", "shm_bytes"
    for name in samples[0]["processes"]:
        for what in ("rss", "fds"):
            yield f"{name} {what}", name, what


def values(samples: list[dict[str, Any]], process: str, what: str) -> list[float]:
    if not process:
        return [s[what] for s in samples]
    found = [s["processes"].get(process, {}).get(what) for s in samples]
    return [v for v in found if v is not None]


def windows(measured: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and the last quarter of the measured samples (at least MEDIAN_OF each).

    A quarter of the run, not a few samples: a window then spans many
    calls of every protocol, so its least fd count is the process's steady
    state, not a moment between a connection's open and its close.
    """
    size = max(MEDIAN_OF, len(measured) // 4)
    return measured[:size], measured[-size:]


def new_fds(process: str, first: list[dict[str, Any]], last: list[dict[str, Any]]) -> str:
    """What a process holds at the end of the run and did not at its start.

    Compares the sample with the fewest fds of each window, as their
    targets counted: e.g. "2 x unix (unnamed), 1 x anon_inode:[eventfd]".
    """

    def fewest(window: list[dict[str, Any]]) -> collections.Counter[str]:
        held = [s["targets"][process] for s in window if process in s["targets"]]
        return collections.Counter(min(held, key=len)) if held else collections.Counter()

    before, after = fewest(first), fewest(last)
    grown = after - before
    listed = ", ".join(f"{count} x {target}" for target, count in grown.most_common(12))
    closed = sum((before - after).values())
    return f"new: {listed or 'none'}" + (f" ({closed} others closed)" if closed else "")


def judge(measured: list[dict[str, Any]], max_growth: float) -> dict[str, Any]:
    """Compare the start of the measured part with its end; list what grew."""
    if len(measured) < 2 * MEDIAN_OF:
        raise SystemExit(f"only {len(measured)} samples after the warm-up; run longer")
    first, last = windows(measured)
    rows, problems = [], []
    for name, process, what in series(measured):
        early, late = values(first, process, what), values(last, process, what)
        if len(early) < MEDIAN_OF or len(late) < MEDIAN_OF:
            problems.append(f"{name}: the process did not last the whole run")
            continue
        # An fd opened for a moment (the control connection this sampler
        # just used, a /proc read) adds one to a sample; a leak raises the
        # least count as well, so fds compare their minimums.
        pick = min if what == "fds" else statistics.median
        start, end = pick(early), pick(late)
        growth = (end - start) / start if start else 0.0
        rows.append({"what": name, "start": start, "end": end, "growth": round(growth, 4)})
        if growth > max_growth:
            problem = f"{name} grew {growth:.1%}: {start:g} -> {end:g}"
            if what == "fds":
                problem += f"; {new_fds(process, first, last)}"
            problems.append(problem)
    return {"rows": rows, "problems": problems}


def restarts(samples: list[dict[str, Any]]) -> list[str]:
    pids = {
        name: {s["processes"].get(name, {}).get("pid") for s in samples}
        for name in samples[0]["processes"]
    }
    return [
        f"{name} restarted: pids {sorted(p for p in got if p)}"
        for name, got in pids.items()
        if len(got) > 1
    ]


def print_table(rows: list[dict[str, Any]], calls: dict[str, Any]) -> None:
    print(f"\n{'what':32} {'start':>14} {'end':>14} {'growth':>8}")
    for row in rows:
        print(f"{row['what']:32} {row['start']:14,.0f} {row['end']:14,.0f} {row['growth']:8.2%}")
    print(f"\n{'protocol':20} {'calls':>8} {'failed':>7} {'p50 ms':>8} {'max ms':>8}")
    for protocol, row in calls.items():
        print(
            f"{protocol:20} {row['calls']:8d} {row['failed']:7d} "
            f"{row['p50_ms']:8.2f} {row['max_ms']:8.2f}"
        )


# -- the run ----------------------------------------------------------------------


def burst_connections(appliance: Appliance) -> int:
    """Connections per protocol for a burst: 8 for each process of the busiest port.

    The processes of a port take connections from its one queue, whichever
    is free first: with 8 connections per process opened at once, each
    process almost surely gets some (:func:`warm_up` checks that it did).
    """
    roles = [p["role"] for p in appliance.processes()]
    per_port = [
        sum(role.startswith(port) for role in roles) for port in ("http worker", "grpc[", "mip[")
    ]
    return 8 * max(1, *per_port)


# tritonclient's gRPC clients of one process share one connection unless
# each keeps its own subchannels; a burst needs one connection per client.
OWN_CONNECTION = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]


def own_connection(caller: type[traffic.Caller]) -> type[traffic.Caller]:
    """``caller``, with a connection of its own where its library would share one."""
    if issubclass(caller, traffic.KserveGrpc):
        return type(caller.__name__, (caller,), {"channel_args": OWN_CONNECTION})
    return caller


def burst(ep: traffic.Endpoints, connections: int, watch: Callable[[], None]) -> list[str]:
    """Call every protocol over many connections at once, so lazy pools fill now.

    ``watch`` is called every SAMPLE_BURST_S while the burst runs.
    """
    errors: list[str] = []

    def calls(caller: type[traffic.Caller]) -> None:
        client = own_connection(caller)(ep)
        rng = np.random.default_rng()
        try:
            for _ in range(BURST_CALLS):
                client(caller.example(rng))
        except Exception as ex:
            errors.append(f"{caller.protocol}: {traffic.describe(ex)}")
        finally:
            client.close()

    threads = [
        threading.Thread(target=calls, args=(caller,), daemon=True)
        for caller in CALLERS
        for _ in range(connections)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + traffic.CALL_TIMEOUT_S * BURST_CALLS
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        watch()
        time.sleep(SAMPLE_BURST_S)
    return errors


def fd_floor(appliance: Appliance) -> dict[str, int]:
    """Each process's least fd count over a few samples a moment apart."""
    floors: dict[str, int] = {}
    for _ in range(MEDIAN_OF):
        for process in appliance.processes():
            fds = fd_targets(process["pid"]) if process["pid"] else None
            if fds is not None:
                key = process_key(process)
                floors[key] = min(floors.get(key, len(fds)), len(fds))
        time.sleep(0.2)
    return floors


def frontend_ports(appliance: Appliance) -> dict[str, int]:
    """Each frontend process (by its key) and the port it serves."""
    port_of = {"http worker": "http", "grpc": "grpc", "mip": "mip"}
    ports = appliance.ports
    found = {}
    for process in appliance.processes():
        kind = port_of.get(str(process["role"]).split("[")[0])
        if kind and process["pid"]:
            found[process_key(process)] = ports[kind]
    return found


def connected(appliance: Appliance, ports: dict[str, int]) -> set[str]:
    """The frontend processes holding a client's connection to their port now."""
    targets = sample(appliance, 0.0)["targets"]
    return {
        key
        for key, port in ports.items()
        if any(t.startswith(f"tcp 127.0.0.1:{port} -> ") for t in targets.get(key, ()))
    }


def warm_up(appliance: Appliance, ep: traffic.Endpoints) -> list[str]:
    """Burst until a whole burst reaches every frontend process and opens no fd anywhere.

    Returns problems: a burst's failed calls, or MAX_BURSTS bursts without
    a steady one (a process whose fds still grow burst after burst is not
    filling a pool, it leaks). Bounded by bursts, not time, so that a busy
    host takes longer instead of failing.
    """
    connections = burst_connections(appliance)
    ports = frontend_ports(appliance)
    floor = fd_floor(appliance)
    for bursts in range(1, MAX_BURSTS + 1):
        reached: set[str] = set()
        errors = burst(
            ep, connections, lambda seen=reached: seen.update(connected(appliance, ports))
        )
        if errors:
            return [f"warm-up burst: {error}" for error in errors]
        after = fd_floor(appliance)
        grew = {k: f"{floor.get(k)} -> {n}" for k, n in after.items() if n > floor.get(k, n)}
        missed = sorted(set(ports) - reached)
        floor = after
        if bursts >= 2 and not grew and not missed:
            print(f"steady after {bursts} bursts of {connections} connections per protocol")
            return []
    return [f"not steady after {MAX_BURSTS} warm-up bursts: fds grew {grew}, missed {missed}"]


def soak(args: argparse.Namespace) -> int:
    duration_s = args.minutes * 60.0
    sample_s = args.sample_s or max(1.0, duration_s / 60)
    with running(**config()) as appliance:
        ports = appliance.ports
        ep = traffic.Endpoints(ports["http"], ports["grpc"], ports["mip"], "faulty")
        started = time.monotonic()
        at_start = sample(appliance, started)
        loops = traffic.start_loops(ep, args.pace_s, CALLERS)
        problems = warm_up(appliance, ep)
        warm_up_s = time.monotonic() - started
        samples = []
        while (now := time.monotonic()) < started + warm_up_s + duration_s * MEASURED:
            samples.append(sample(appliance, started))
            hung = [
                loop.protocol for loop in loops if loop.stuck_s(now) > traffic.CALL_TIMEOUT_S * 2
            ]
            if hung:
                problems.append(f"calls hung: {hung}")
                break
            time.sleep(max(0.0, sample_s - (time.monotonic() - now)))
        samples.append(sample(appliance, started))
        problems += [f"{p}: a call did not end" for p in traffic.stop_loops(loops)]
        calls = traffic.summarize(c for loop in loops for c in loop.calls)
    failed = [c for loop in loops for c in loop.calls if c.error]
    problems += [f"{len(failed)} calls failed, first: {failed[0]}"] if failed else []
    verdict = judge(samples, args.max_growth)
    problems += verdict["problems"] + restarts([at_start, *samples])
    print_table(verdict["rows"], calls)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "minutes": args.minutes,
                "warm_up_s": round(warm_up_s, 1),
                "max_growth": args.max_growth,
                "calls": calls,
                "growth": verdict["rows"],
                "problems": problems,
                "samples": [{k: v for k, v in s.items() if k != "targets"} for s in samples],
            },
            indent=1,
        )
    )
    print(f"\n{len(samples)} samples, warm-up {warm_up_s:.0f} s; written to {args.out}")
    for problem in problems:
        print(f"FAIL: {problem}")
    print("soak:", "FAILED" if problems else "passed")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run")
    parser.add_argument("--sample-s", type=float, default=0.0, help="default: minutes, in s")
    parser.add_argument("--pace-s", type=float, default=0.04, help="one call per loop per this")
    parser.add_argument("--max-growth", type=float, default=0.05, help="allowed after warm-up")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return soak(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
