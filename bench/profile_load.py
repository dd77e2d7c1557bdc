"""Profile the appliance under one of bench_peers.py's loads, with py-spy.

Starts the appliance as bench_peers.py configures it, drives one system and
payload from client processes (bench/loadgen.py), and meanwhile samples every
appliance process with ``py-spy record --subprocesses``. Prints the row the
load measured, CPU per request of each process and each thread (psutil: the
native threads py-spy does not see, ZeroMQ's I/O threads and grpcio's,
included), then per process its share of the samples and the functions
that dominate it: by self time (the frame on top) and inclusive time (the
frame anywhere on the stack). Not run by ``make bench``. Usage::

    python bench/profile_load.py --system kserve-rest --payload 16B --clients 1
    python bench/profile_load.py --system direct --payload digits --clients 64
    python bench/profile_load.py --system kserve-grpc --svg bench/profiles/kserve-grpc-c1.svg
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers, threads  # noqa: E402
from bench.bench_peers import appliance_endpoints  # noqa: E402
from bench.loadgen import ClientPool, ProcessTree  # noqa: E402
from bench.plan import SYSTEMS, System, appliance_models, appliance_sections, spec_for  # noqa: E402
from tests.system.harness import running  # noqa: E402

PY_SPY = Path(sys.executable).with_name("py-spy")
LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", default="kserve-rest", help="bench/plan.py name, or direct")
    parser.add_argument("--payload", default="16B", help="16B 16KiB 1MiB 16MiB digits ...")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=12, help="functions per process")
    parser.add_argument(
        "--gil", action="store_true", help="only samples holding the GIL (Python's own CPU time)"
    )
    parser.add_argument(
        "--svg", type=Path, help="also write a flame graph of every process (a second run)"
    )
    args = parser.parse_args()
    system = SYSTEMS.get(args.system) or System("direct", "appliance", "direct", "run_dir")
    with (
        ClientPool(args.clients, callers.make_call, callers.PRELOAD, "forkserver") as pool,
        running(appliance_models(), **appliance_sections()) as appliance,
    ):
        spec = spec_for(system, args.payload, {"appliance": appliance_endpoints(appliance)})
        try:
            pool.measure(spec, args.clients, 1.0)  # warm up
            with tempfile.NamedTemporaryFile(suffix=".txt") as raw:
                spy = start_py_spy(appliance.process.pid, args, Path(raw.name))
                tree = ProcessTree(appliance.process.pid)
                tree.refresh()
                before, threads_before = per_process(tree), tree.thread_times()
                row = pool.measure(spec, args.clients, args.seconds, tree)
                after, threads_after = per_process(tree), tree.thread_times()
                spy.wait(args.seconds + 60)
                stacks = Path(raw.name).read_text()
            if args.svg:
                # py-spy writes one format per run: the flame graph gets a run of its own.
                spy = start_py_spy(appliance.process.pid, args, args.svg, "flamegraph")
                pool.measure(spec, args.clients, args.seconds, tree)
                spy.wait(args.seconds + 60)
        finally:
            pool.release()
    print(
        f"{args.system} {args.payload} c={args.clients}: {row['rps']:.0f} req/s, "
        f"p50 {row['p50_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms, server "
        f"{row['server_cpu_us']:.0f} µs CPU/req, clients {row['client_cpu_us']:.0f} µs CPU/req"
    )
    print("\nCPU µs per request by process (psutil, over the measurement and its warm-up):")
    for pid, (name, seconds) in sorted(after.items(), key=lambda item: -item[1][1]):
        used = seconds - before.get(pid, (name, 0.0))[1]
        if used > 0.005:
            print(f"  {used / max(1, row['requests']) * 1e6:8.0f}  {name} ({pid})")
    print("\nCPU µs per request by thread kind (bench/threads.py):")
    for kind in threads.ordered(row["threads_us"]):
        print(f"  {row['threads_us'][kind]:8.0f}  {kind}")
    print("\nCPU µs per request by thread (bench/threads.py; 3 µs and up):")
    by_name = threads.per_request(threads_before, threads_after, row["requests"], thread_name)
    for name, used in sorted(by_name.items(), key=lambda item: -item[1]):
        if used >= 3:
            print(f"  {used:8.0f}  {name}")
    summarise(stacks, args.top, row["requests"])
    return 0


def per_process(tree: ProcessTree) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each process in the tree, with its title."""
    out = {}
    for process in tree.processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            out[process.pid] = (" ".join(process.cmdline())[:60], times.user + times.system)
    return out


def thread_name(thread: threads.ThreadTime) -> str:
    """The process title and the thread name: py-spy sees only Python threads, ZeroMQ's and
    grpcio's native threads show here."""
    return f"{thread.title[:45].strip()}: {thread.name}"


def start_py_spy(
    pid: int, args: argparse.Namespace, out: Path, form: str = "raw"
) -> subprocess.Popen[bytes]:
    argv = [str(PY_SPY), "record", "--pid", str(pid), "--subprocesses", "--nonblocking"]
    argv += ["--format", form, "--nolineno", "--rate", str(args.rate)]
    argv += ["--duration", str(int(args.seconds)), "--output", str(out)]
    argv += ["--gil"] if args.gil else []
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # py-spy attaches to every process before the load starts
    return process


def summarise(stacks: str, top: int, requests: int) -> None:
    """Per process: samples, then the top functions by self and inclusive samples."""
    total: Counter[str] = Counter()
    own: dict[str, Counter[str]] = defaultdict(Counter)
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    for line in stacks.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        frames = match["stack"].split(";")
        count = int(match["count"])
        # --subprocesses nests each child's frames under its parents' process frames.
        owners = [f for f in frames if f.startswith("process ")]
        process = owners[-1] if owners else "?"
        names = [short(f) for f in frames if not f.startswith(("process ", "thread "))]
        if not names:
            continue
        total[process] += count
        own[process][names[-1]] += count
        for name in set(names):
            inclusive[process][name] += count
    every = sum(total.values()) or 1
    print(f"\n{every} samples of busy threads ({requests} requests measured)")
    for process, samples in total.most_common():
        print(f"\n{process[:90]}: {samples / every:.0%} of all samples")
        for title, table in (("self", own[process]), ("inclusive", inclusive[process])):
            print(f"  by {title}:")
            for name, count in table.most_common(top):
                print(f"    {count / samples:6.1%}  {name}")


def short(frame: str) -> str:
    """'func (path/to/module.py)' -> 'func (module.py)'."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')')).name})" if where else name


if __name__ == "__main__":
    sys.exit(main())
