"""KServe v2 end to end: the stock tritonclient against ``identity``.

Several client processes each run a closed loop (one request in flight per
process) for a fixed time, per transport and tensor size:

- ``grpc``: tritonclient.grpc, tensor in raw_input_contents and back;
- ``rest``: tritonclient.http, binary tensor data both ways;
- ``shm``: tritonclient.grpc with the system shared-memory extension: the
  client writes its input into its own region, the appliance reads it from
  there and writes the output back into the client's region; only
  descriptors cross the socket;
- ``direct``: the appliance's internal ModelClient from the same processes,
  the floor the protocols add to (measured in the same run).

Sizes are 64 B, 16 KiB and 1 MiB of FP32. The appliance runs as ``make run``
configures it (2 HTTP workers, 1 gRPC process). Each configuration is
repeated; the table shows medians over repeats; bench/results/kserve.json
holds every repeat. Usage::

    python bench/bench_kserve.py [--clients N] [--seconds S] [--repeats R] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.system.harness import demo_models, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "kserve.json"
MiB = 1 << 20
SIZES = {"64B": 64, "16KiB": 16 << 10, "1MiB": MiB}
MODES = ("grpc", "rest", "shm", "direct")
WARMUP_S = 0.3


def tensor(nbytes: int) -> np.ndarray:
    count = max(1, nbytes // 4)
    return np.random.default_rng(0).random(count, dtype=np.float32).reshape(1, count)


class Caller:
    """One client process's ways of calling ``identity``."""

    def __init__(self, ports: dict[str, int], run_dir: str) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        import tritonclient.utils.shared_memory as shm

        from appliance.client.api import ModelClient

        self.grpcclient, self.httpclient, self.shm = grpcclient, httpclient, shm
        self.grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        self.http = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}")
        self.direct = ModelClient.connect(Path(run_dir))
        tag = f"kbench{os.getpid()}"
        self.names = (f"{tag}_in", f"{tag}_out")
        self.regions = [shm.create_shared_memory_region(n, f"/{n}", MiB) for n in self.names]
        for name in self.names:
            self.grpc.register_system_shared_memory(name, f"/{name}", MiB)

    def call(self, mode: str, x: np.ndarray) -> None:
        if mode == "direct":
            with self.direct.infer("identity", {"INPUT0": x}) as result:
                y = result.array("OUTPUT0")
                check(y[0, -1], x)
            return
        if mode == "shm":
            self.shm.set_shared_memory_region(self.regions[0], [x])
            value = self.grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            value.set_shared_memory(self.names[0], x.nbytes)
            wanted = self.grpcclient.InferRequestedOutput("OUTPUT0")
            wanted.set_shared_memory(self.names[1], x.nbytes)
            self.grpc.infer("identity", [value], outputs=[wanted])
            y = self.shm.get_contents_as_numpy(self.regions[1], np.float32, x.shape)
            check(y[0, -1], x)
            return
        module, client = (
            (self.grpcclient, self.grpc) if mode == "grpc" else (self.httpclient, self.http)
        )
        value = module.InferInput("INPUT0", list(x.shape), "FP32")
        value.set_data_from_numpy(x)
        check(client.infer("identity", [value]).as_numpy("OUTPUT0")[0, -1], x)

    def close(self) -> None:
        self.grpc.unregister_system_shared_memory(self.names[0])
        self.grpc.unregister_system_shared_memory(self.names[1])
        for region in self.regions:
            self.shm.destroy_shared_memory_region(region)
        self.grpc.close()
        self.http.close()
        self.direct.close()


def check(last: Any, x: np.ndarray) -> None:
    if last != x[0, -1]:
        raise AssertionError("identity returned other data than it was sent")


def client_process(conn: Connection, ports: dict[str, int], run_dir: str) -> None:
    """Serve run commands from the parent until told to stop."""
    caller = Caller(ports, run_dir)
    conn.send("ready")
    try:
        while True:
            command = conn.recv()
            if command is None:
                return
            mode, nbytes, start_at, stop_at = command
            x = tensor(nbytes)
            while time.time() < start_at:
                caller.call(mode, x)  # warm up until everyone starts
            latencies = []
            while (now := time.perf_counter()) and time.time() < stop_at:
                caller.call(mode, x)
                latencies.append(time.perf_counter() - now)
            conn.send(latencies)
    finally:
        caller.close()


def measure(conns: list[Connection], mode: str, nbytes: int, seconds: float) -> dict[str, float]:
    start_at = time.time() + WARMUP_S
    for conn in conns:
        conn.send((mode, nbytes, start_at, start_at + seconds))
    latencies = sorted(value for conn in conns for value in conn.recv())
    done = len(latencies)
    return {
        "requests": done,
        "rps": done / seconds,
        "p50_ms": latencies[done // 2] * 1e3,
        "p99_ms": latencies[min(done - 1, int(done * 0.99))] * 1e3,
        "mbps": done * nbytes / seconds / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeats = 0.5, 1
    sections = {
        "http": {"workers": 2, "threads": 8},
        "grpc": {"workers": 1, "threads": 8},
        "shm": {"request_ring_bytes": 64 * MiB, "response_ring_bytes": 64 * MiB},
    }
    with running(demo_models("identity"), **sections) as appliance:
        runs = run_clients(appliance.ports, str(appliance.run_dir), args)
    summary = summarise(runs)
    report(summary, args.clients)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_bytes(
        orjson.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
                "clients": args.clients,
                "seconds": args.seconds,
                "repeats": args.repeats,
                "summary": summary,
                "runs": runs,
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


def run_clients(
    ports: dict[str, int], run_dir: str, args: argparse.Namespace
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Start the client processes and run every measurement, repeats outermost."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        mode: {size: [] for size in SIZES} for mode in MODES
    }
    context = mp.get_context("spawn")
    pipes = [context.Pipe() for _ in range(args.clients)]
    processes = [
        context.Process(target=client_process, args=(child, ports, run_dir))
        for _parent, child in pipes
    ]
    for process in processes:
        process.start()
    conns = [parent for parent, _child in pipes]
    try:
        for conn in conns:
            if conn.recv() != "ready":
                raise RuntimeError("a client process failed to start")
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
            for size, nbytes in SIZES.items():
                for mode in MODES:
                    runs[mode][size].append(measure(conns, mode, nbytes, args.seconds))
    finally:
        for conn in conns:
            conn.send(None)
        for process in processes:
            process.join(30)
    return runs


def summarise(runs: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for mode, by_size in runs.items():
        table[mode] = {
            size: {key: statistics.median(r[key] for r in repeats) for key in repeats[0]}
            for size, repeats in by_size.items()
        }
    ratios = {
        size: {
            "grpc_vs_direct_rps": table["grpc"][size]["rps"] / table["direct"][size]["rps"],
            "rest_vs_grpc_rps": table["rest"][size]["rps"] / table["grpc"][size]["rps"],
            "shm_vs_grpc_rps": table["shm"][size]["rps"] / table["grpc"][size]["rps"],
        }
        for size in SIZES
    }
    return {"by_mode": table, "ratios": ratios}


def report(summary: dict[str, Any], clients: int) -> None:
    print(f"\nidentity, {clients} client processes, closed loop (medians over repeats)")
    print(f"{'mode':>7} {'size':>6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'MB/s':>8}")
    for mode, by_size in summary["by_mode"].items():
        for size, row in by_size.items():
            print(
                f"{mode:>7} {size:>6} {row['rps']:>9.0f} {row['p50_ms']:>8.3f} "
                f"{row['p99_ms']:>8.3f} {row['mbps']:>8.1f}"
            )
    print("\nratios of throughput, same run:")
    for size, row in summary["ratios"].items():
        text = ", ".join(f"{key} {value:.2f}" for key, value in row.items())
        print(f"  {size}: {text}")


if __name__ == "__main__":
    sys.exit(main())
