"""Bytecodes per request, by function, in the frontend and the model worker under load.

Starts the appliance as bench_peers.py configures it, with bench/hooks on its
PYTHONPATH (a sitecustomize that counts bytecodes when signalled), warms one
system up, then counts while the load runs: every bytecode each Python
function of the HTTP or gRPC frontend and of the model worker runs, divided
by the requests answered. Counting slows the processes tenfold, so the load's
rates mean nothing; what the counts say is how much Python a request costs
and where. C (the kernel, libzmq, orjson, numpy, and modules compiled by
appliance/native.py) is not counted: the request path runs as Python unless
``--compiled``. Not run by ``make bench``. Usage::

    python bench/bytecodes.py --system kserve-rest-json --clients 1 --top 40
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers  # noqa: E402
from bench.bench_peers import appliance_endpoints  # noqa: E402
from bench.hooks.sitecustomize import SIGNAL  # noqa: E402
from bench.loadgen import ClientPool, ProcessTree  # noqa: E402
from bench.plan import SYSTEMS, appliance_models, appliance_sections, spec_for  # noqa: E402
from tests.system.harness import running  # noqa: E402

# The processes counted, by a part of their title.
COUNTED = {
    "frontend": ("worker [appliance: http]", "appliance: grpc["),
    "worker": ("model[identity",),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", default="kserve-rest-json", help="bench/plan.py name")
    parser.add_argument("--payload", default="16B")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--top", type=int, default=30, help="functions shown per process")
    parser.add_argument("--compiled", action="store_true", help="leave the request path compiled")
    args = parser.parse_args()
    system = SYSTEMS[args.system]
    with tempfile.TemporaryDirectory() as counts:
        env = {
            "APPLIANCE_BYTECODES": counts,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(ROOT / "bench" / "hooks"), os.environ.get("PYTHONPATH")])
            ),
        }
        if not args.compiled:
            env["APPLIANCE_PURE"] = "1"
        with (
            ClientPool(args.clients, callers.make_call, callers.PRELOAD, "forkserver") as pool,
            running(appliance_models(), env=env, **appliance_sections()) as appliance,
        ):
            spec = spec_for(system, args.payload, {"appliance": appliance_endpoints(appliance)})
            try:
                pool.measure(spec, args.clients, 1.0)  # warm up
                tree = ProcessTree(appliance.process.pid)
                tree.refresh()
                counted = {
                    process.pid: role
                    for process in tree.processes
                    for role, titles in COUNTED.items()
                    if any(title in " ".join(process.cmdline()) for title in titles)
                }
                for pid in counted:
                    os.kill(pid, SIGNAL)
                row = pool.measure(spec, args.clients, args.seconds, tree)
                for pid in counted:
                    os.kill(pid, SIGNAL)
                time.sleep(1.0)
            finally:
                pool.release()
            report(Path(counts), counted, int(row["requests"]), args)
    return 0


def report(counts: Path, counted: dict[int, str], requests: int, args: argparse.Namespace) -> None:
    tables = {pid: read(counts / f"{pid}.txt") for pid in counted}
    # The counting runs a little longer than the load's window: requests are the
    # model's calls while counting (identity's predict, once a request), where seen.
    predicts = [
        calls[where]
        for ops, calls in tables.values()
        for where in calls
        if where.startswith("Identity.predict ")
    ]
    requests = sum(predicts) or requests
    print(f"{args.system} {args.payload}, {args.clients} client(s): {requests} requests counted")
    for pid, role in sorted(counted.items(), key=lambda item: item[1]):
        ops, calls = tables[pid]
        total = sum(ops.values())
        if total < requests:
            continue  # a frontend process that served none of it
        print(f"\n{role} (pid {pid}): {total / requests:,.0f} bytecodes a request")
        print("  bytecodes/req  calls/req  function")
        for where, n in ops.most_common(args.top):
            print(f"  {n / requests:13,.0f}  {calls[where] / requests:9.1f}  {where}")
        by_file: Counter[str] = Counter()
        for where, n in ops.items():
            by_file[where.rsplit("(", 1)[1].split(":")[0]] += n
        print(
            "  by file: "
            + ", ".join(f"{f} {n / requests:,.0f}" for f, n in by_file.most_common(12))
        )


def read(path: Path) -> tuple[Counter[str], Counter[str]]:
    """A process's bytecodes and calls by function (none if it wrote no counts)."""
    ops: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            n, c, where = line.split(" ", 2)
            ops[where], calls[where] = int(n), int(c)
    return ops, calls


if __name__ == "__main__":
    sys.exit(main())
