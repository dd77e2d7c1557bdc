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
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.soak_load import CALLERS, burst, config  # noqa: E402
from bench.soak_sampling import fd_targets, process_key, sample  # noqa: E402
from bench.soak_verdict import MEDIAN_OF, judge, print_table, restarts  # noqa: E402
from tests.system import traffic  # noqa: E402
from tests.system.harness import Appliance, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "soak.json"
MAX_BURSTS = 6
# The part of --minutes measured after the warm-up (which takes what it needs).
MEASURED = 0.75


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
