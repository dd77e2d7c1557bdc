"""The same small request in real Triton and in the appliance, split by thread and by library.

Serves bench_peers' ``identity`` with tritonserver 2.51 (its Python backend,
bench/triton_peer.py) and with the appliance (bench_peers' config), drives
each with the same clients (bench/loadgen.py), one server after the other,
and prints per server: the load's row, CPU per request of each thread of its
process tree (bench/threads.py: by thread kind, then threads of one name
summed), and, with ``--perf``, the
same CPU split by the library it ran in (``perf record -e cpu-clock`` on
every process of the tree; ``[kernel]`` is the kernel's share, ``python``
the interpreter's). So the rung-by-rung difference of one request is on one
page: which threads each server wakes, and where each spends its CPU. Not
run by ``make bench``. Usage::

    python bench/profile_triton.py --triton "triton rest-json" --appliance kserve-rest-json \\
        --clients 1 --seconds 6 --perf > bench/profiles/triton-vs-appliance-rest-json-c1.txt
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers, threads, triton_peer  # noqa: E402
from bench.bench_peers import appliance_endpoints  # noqa: E402
from bench.loadgen import ClientPool, ProcessTree  # noqa: E402
from bench.plan import SYSTEMS, appliance_models, appliance_sections, spec_for  # noqa: E402
from tests.system.harness import running  # noqa: E402

# Thread names that carry a number per instance (grpc's "grpcpp_sync_ser", "ZMQbg/IO/0").
NUMBERED = re.compile(r"[/_-]?\d+$")
# perf's shared objects, folded into the names a reader knows.
LIBRARIES = (
    ("libpython", "python"),
    ("[kernel", "[kernel]"),
    ("libzmq", "libzmq"),
    ("_multiarray", "numpy"),
    ("libtriton", "libtritonserver"),
    ("triton_python_backend_stub", "python stub"),
    ("libc.so", "libc"),
    ("libstdc++", "libstdc++"),
    ("cygrpc", "grpcio"),
    ("libgrpc", "grpc"),
    ("orjson", "orjson"),
    ("uvloop", "uvloop"),
    ("httptools", "httptools"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--triton", default="triton rest-json", help="a triton system of plan.py")
    parser.add_argument("--appliance", default="kserve-rest-json", help="the appliance's system")
    parser.add_argument("--payload", default="16B")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--perf", action="store_true", help="split each server's CPU by library")
    args = parser.parse_args()
    with ClientPool(args.clients, callers.make_call, callers.PRELOAD, "forkserver") as pool:
        try:
            with triton_peer.bench_models() as triton:
                endpoints = {"triton": triton.urls}
                spec = spec_for(SYSTEMS[args.triton], args.payload, endpoints)
                report(args.triton, profile(pool, spec, triton.process.pid, args))
            with running(appliance_models(), **appliance_sections()) as appliance:
                endpoints = {"appliance": appliance_endpoints(appliance)}
                spec = spec_for(SYSTEMS[args.appliance], args.payload, endpoints)
                report(args.appliance, profile(pool, spec, appliance.process.pid, args))
        finally:
            pool.release()
    return 0


def profile(pool: ClientPool, spec: dict[str, Any], pid: int, args: Any) -> dict[str, Any]:
    """One warmed-up measurement of ``spec``: the row, CPU by thread and (--perf) by library."""
    pool.measure(spec, args.clients, 1.0)
    tree = ProcessTree(pid)
    tree.refresh()
    before = tree.thread_times()
    with perf_recording(tree, args.seconds + 2) if args.perf else contextlib.nullcontext() as perf:
        row = pool.measure(spec, args.clients, args.seconds, tree)
    after = tree.thread_times()
    by_name = threads.per_request(before, after, row["requests"], thread_name)
    libraries = perf() if perf is not None else {}
    total = sum(libraries.values()) or 1
    # perf's samples say which library; psutil's CPU says how much: the shares scale the total.
    server_us = row["server_cpu_us"]
    return {
        "row": row,
        "threads": by_name,
        "libraries": {lib: share / total * server_us for lib, share in libraries.items()},
    }


@contextlib.contextmanager
def perf_recording(tree: ProcessTree, seconds: float) -> Iterator[Callable[[], dict[str, float]]]:
    """``perf record`` of every process of ``tree`` while the block runs; yields a reader of
    its samples by library (call it after the block)."""
    if shutil.which("perf") is None:
        raise SystemExit("--perf needs perf (linux-perf) on the PATH")
    pids = ",".join(str(p.pid) for p in tree.processes)
    with tempfile.TemporaryDirectory() as where:
        data = Path(where) / "perf.data"
        argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1000", "-p", pids]
        argv += ["-o", str(data), "--", "sleep", str(seconds)]
        recording = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        found: dict[str, float] = {}

        def read() -> dict[str, float]:
            return found

        try:
            yield read
        finally:
            recording.wait(seconds + 30)
            found.update(by_library(data))


def by_library(data: Path) -> dict[str, float]:
    """perf's samples in ``data`` by library, folded (see LIBRARIES)."""
    argv = ["perf", "report", "-i", str(data), "--sort", "dso", "--stdio", "-q"]
    text = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    found: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = re.match(r"\s*([\d.]+)%\s+(\S.*)$", line)
        if match:
            dso = match[2].strip()
            name = next((label for key, label in LIBRARIES if key in dso), dso)
            found[name] += float(match[1])
    return found


def thread_name(thread: threads.ThreadTime) -> str:
    """The process title and the thread name, a thread's number dropped so a pool sums."""
    return f"{thread.title[:32]}: {NUMBERED.sub('', thread.name)}"


def report(system: str, found: dict[str, Any]) -> None:
    row = found["row"]
    print(
        f"\n{system} c={row['concurrency']}: {row['rps']:.0f} req/s, p50 {row['p50_ms']:.3f} ms, "
        f"server {row['server_cpu_us']:.0f} µs CPU/req, clients {row['client_cpu_us']:.0f}"
    )
    print("  CPU µs per request by thread kind (bench/threads.py):")
    for kind in threads.ordered(row.get("threads_us", {})):
        print(f"    {row['threads_us'][kind]:7.0f}  {kind}")
    print("  CPU µs per request by thread (bench/threads.py; 2 µs and up, same names summed):")
    for name, used in sorted(found["threads"].items(), key=lambda item: -item[1]):
        if used >= 2:
            print(f"    {used:7.0f}  {name}")
    if found["libraries"]:
        print("  CPU µs per request by library (perf's share of samples x the server's CPU):")
        for name, used in sorted(found["libraries"].items(), key=lambda item: -item[1]):
            if used >= 2:
                print(f"    {used:7.0f}  {name}")


if __name__ == "__main__":
    raise SystemExit(main())
