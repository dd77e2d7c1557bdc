"""Soak: moderate load on every protocol for a while; resources must not grow.

Starts an appliance (HTTP, gRPC and MIP workers sized to the host, as by
default; ``faulty`` with 2 instances and ``identity``), then runs the stock
clients of every protocol in loops (tests/system/traffic.py: KServe REST and
gRPC, GRPS, GraphPipe, UM-Bridge, MIP with small tensors, and KServe REST and
gRPC with 256 KiB tensors). A
burst of concurrent calls first fills every lazily grown pool (frontend
threads, their channels). Every ``--sample-s`` it samples, per process of
the tree: RSS (``appliance ctl status``) and open fds (/proc/<pid>/fd), and
the tree's /dev/shm usage (the sizes of ``appliance-<tree>-*``).

After the warm-up (the first quarter of the run), the median of the first
three samples is the baseline and the median of the last three the end; the
run fails if any of them grew by more than ``--max-growth`` (5 %), if any
process was restarted, or if any call failed or hung. The table goes to
stdout, every sample to ``--out`` (bench/results/soak.json). Usage::

    python bench/soak.py [--minutes 10] [--sample-s S] [--pace-s 0.04] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
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


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def shm_bytes(tree: str) -> tuple[int, int]:
    """Total size and count of the tree's /dev/shm files."""
    sizes = []
    for path in Path("/dev/shm").glob(f"appliance-{tree}-*"):
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            continue
    return sum(sizes), len(sizes)


def sample(appliance: Appliance, started: float) -> dict[str, Any]:
    processes = {}
    for process in appliance.processes():
        pid = process["pid"]
        if not pid or process.get("rss_bytes") is None:
            continue  # a slot whose process is gone
        key = f"{process['role']} {pid}" if process["role"] == "http worker" else process["role"]
        processes[key] = {"pid": pid, "rss": process["rss_bytes"], "fds": open_fds(pid)}
    shm, segments = shm_bytes(appliance.tree)
    return {
        "t": round(time.monotonic() - started, 2),
        "processes": processes,
        "shm_bytes": shm,
        "shm_files": segments,
    }


# -- judging ----------------------------------------------------------------------


def series(samples: list[dict[str, Any]]) -> Iterator[tuple[str, list[float]]]:
    """Every measured quantity: (name, values over the samples)."""
    yield "shm bytes", [s["shm_bytes"] for s in samples]
    names = samples[0]["processes"].keys()
    for name in names:
        for what in ("rss", "fds"):
            values = [s["processes"].get(name, {}).get(what) for s in samples]
            yield f"{name} {what}", [v for v in values if v is not None]


def judge(samples: list[dict[str, Any]], warm_up_s: float, max_growth: float) -> dict[str, Any]:
    """Compare the start of the measured part with its end; list what grew."""
    measured = [s for s in samples if s["t"] >= warm_up_s]
    if len(measured) < 2 * MEDIAN_OF:
        raise SystemExit(f"only {len(measured)} samples after the warm-up; run longer")
    rows, problems = [], []
    for name, values in series(measured):
        if len(values) < 2 * MEDIAN_OF:
            problems.append(f"{name}: the process did not last the whole run")
            continue
        # An fd opened for a moment (the control connection this sampler
        # just used, a /proc read) adds one to a sample; a leak raises the
        # least count as well, so fds compare their minimums.
        pick = min if name.endswith(" fds") else statistics.median
        start = pick(values[:MEDIAN_OF])
        end = pick(values[-MEDIAN_OF:])
        growth = (end - start) / start if start else 0.0
        rows.append({"what": name, "start": start, "end": end, "growth": round(growth, 4)})
        if growth > max_growth:
            problems.append(f"{name} grew {growth:.1%}: {start:g} -> {end:g}")
    pids = {
        name: {s["processes"].get(name, {}).get("pid") for s in samples}
        for name in samples[0]["processes"]
    }
    problems += [
        f"{name} restarted: pids {sorted(p for p in got if p)}"
        for name, got in pids.items()
        if len(got) > 1
    ]
    return {"rows": rows, "problems": problems}


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
    """Connections per protocol for the burst: 8 for each process of the busiest port.

    Processes sharing a port (SO_REUSEPORT) are handed connections by a hash:
    with 8 per process, each one almost surely gets some, and with them its
    own channels to every model instance, before the measurement starts.
    """
    roles = [p["role"] for p in appliance.processes()]
    per_port = [
        sum(role.startswith(port) for role in roles) for port in ("http worker", "grpc[", "mip[")
    ]
    return 8 * max(1, *per_port)


def burst(ep: traffic.Endpoints, connections: int) -> list[str]:
    """Call every protocol over many connections at once, so lazy pools fill now."""
    errors: list[str] = []

    def calls(caller: type[traffic.Caller]) -> None:
        client = caller(ep)
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
    for thread in threads:
        thread.join(traffic.CALL_TIMEOUT_S * BURST_CALLS)
    return errors


def soak(args: argparse.Namespace) -> int:
    duration_s = args.minutes * 60.0
    warm_up_s = duration_s / 4
    sample_s = args.sample_s or max(1.0, duration_s / 60)
    with running(**config()) as appliance:
        ports = appliance.ports
        ep = traffic.Endpoints(ports["http"], ports["grpc"], ports["mip"], "faulty")
        started = time.monotonic()
        problems = [f"warm-up burst: {e}" for e in burst(ep, burst_connections(appliance))]
        loops = traffic.start_loops(ep, args.pace_s, CALLERS)
        samples = []
        while (now := time.monotonic()) < started + duration_s:
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
    verdict = judge(samples, warm_up_s, args.max_growth)
    problems += verdict["problems"]
    print_table(verdict["rows"], calls)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "minutes": args.minutes,
                "warm_up_s": warm_up_s,
                "max_growth": args.max_growth,
                "calls": calls,
                "growth": verdict["rows"],
                "problems": problems,
                "samples": samples,
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
