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
configures it (HTTP and gRPC workers sized to the host, "auto"). Each
configuration is repeated; the table shows medians over repeats; bench/results/kserve.json
holds every repeat. Usage::

    python bench/bench_kserve.py [--clients N] [--seconds S] [--repeats R] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loadgen import (  # noqa: E402
    ClientPool,
    ProcessTree,
    median_row,
    mode_call,
    mode_grid,
    write_results,
)
from tests.system.harness import demo_models, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "kserve.json"
MiB = 1 << 20
SIZES = {"64B": 64, "16KiB": 16 << 10, "1MiB": MiB}
MODES = ("grpc", "rest", "shm", "direct")


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
        # As make run sizes them: one process per 2 CPUs (HTTP) and 4 (gRPC), two at least.
        "http": {"workers": "auto", "threads": 8},
        "grpc": {"workers": "auto", "threads": 8},
        "shm": {"request_ring_bytes": 64 * MiB, "response_ring_bytes": 64 * MiB},
    }
    with running(demo_models("identity"), **sections) as appliance:
        runs = run_clients(appliance, args)
    summary = summarise(runs)
    report(summary, args.clients)
    write_results(
        RESULTS,
        clients=args.clients,
        seconds=args.seconds,
        repeats=args.repeats,
        summary=summary,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


def run_clients(appliance: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run every measurement from ``args.clients`` client processes, repeats outermost."""
    caller_args = (appliance.ports, str(appliance.run_dir))
    with ClientPool(args.clients, functools.partial(mode_call, Caller)) as pool:
        server = ProcessTree(appliance.process.pid)
        return mode_grid(pool, MODES, SIZES, caller_args, args.seconds, args.repeats, server)


def summarise(runs: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for mode, by_size in runs.items():
        table[mode] = {size: median_row(repeats) for size, repeats in by_size.items()}
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
    print(
        f"{'mode':>7} {'size':>6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'MB/s':>8} "
        f"{'srv us/req':>10}"
    )
    for mode, by_size in summary["by_mode"].items():
        for size, row in by_size.items():
            print(
                f"{mode:>7} {size:>6} {row['rps']:>9.0f} {row['p50_ms']:>8.3f} "
                f"{row['p99_ms']:>8.3f} {row['mbps']:>8.1f} {row['server_cpu_us']:>10.0f}"
            )
    print("\nratios of throughput, same run:")
    for size, row in summary["ratios"].items():
        text = ", ".join(f"{key} {value:.2f}" for key, value in row.items())
        print(f"  {size}: {text}")


if __name__ == "__main__":
    sys.exit(main())
