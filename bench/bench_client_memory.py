"""A/B in one run: KServe system shared memory at 1 MiB, mapped copies against preadv/pwritev.

Issue 33: a client that truncates its registered segment while a request
copies from it killed the frontend with SIGBUS, because regions were mapped.
Now their bytes are copied with preadv/pwritev (appliance/core/client_memory.py)
and the issue asks that bench_peers' 1 MiB system shared-memory rows keep at
least 0.8x the throughput they had. This measures both in the same run:

- A, the baseline: the appliance package at ``--baseline`` (by default the
  commit before client memory stopped being mapped);
- B, the candidate: the package at ``--candidate`` (by default HEAD), so that
  changes not committed yet in the working tree stay out of the comparison.

Each is exported with ``git archive`` into a temporary directory and served
from there. ``--export DIR`` only writes them to DIR/A and DIR/B (for a host
without the repository's history, such as the device machine); ``--trees
DIR`` then measures those.

Both serve at once with bench_peers' config (``appliance_sections``, and its
``identity`` entry of ``appliance_models``; MIP listens for identity alone).
For each repeat, each protocol and each of bench_peers' 1 MiB concurrencies
(1, 4, 16 clients), A and B are measured back to back, the order alternating
between repeats so that the shared machine's drift weighs on both alike.
Protocols: ``kserve-shm`` (tritonclient gRPC, input and output in system
shared memory: bench_peers' row) and ``kserve-shm-rest`` (the same over
tritonclient HTTP, the transport the issue's crash was seen on). Before
measuring it checks that A maps the client's segments and B does not, so the
two really differ. Usage::

    python bench/bench_client_memory.py [--baseline REV] [--candidate REV]
        [--seconds S] [--repeats R] [--export DIR | --trees DIR]

Results: bench/results/client-memory-ab.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers  # noqa: E402
from bench.client_process import Call  # noqa: E402
from bench.loadgen import (  # noqa: E402
    ClientPool,
    ProcessTree,
    export_package,
    machine,
    write_results,
)
from bench.plan import FULL_SWEEP, MiB, appliance_models, appliance_sections  # noqa: E402
from tests.system.harness import Appliance, make_config, new_run_dir  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "client-memory-ab.json"
PROTOCOLS = {"kserve-shm": "grpc", "kserve-shm-rest": "http"}
LEVELS = FULL_SWEEP["1MiB"]
# The commit that stopped mapping client memory; the baseline is its parent.
INTRODUCED = "appliance/core/client_memory.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="the A side's commit (default: before the change)")
    parser.add_argument("--candidate", default="HEAD", help="the B side's commit (HEAD)")
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the whole grid")
    parser.add_argument("--export", type=Path, help="only export A and B into this directory")
    parser.add_argument("--trees", type=Path, help="measure the A and B exported here")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.trees:
            trees = args.trees
            revisions = orjson.loads((trees / "revisions.json").read_bytes())
        else:
            trees = args.export or Path(stack.enter_context(tempfile.TemporaryDirectory()))
            baseline = git("rev-parse", "--short", args.baseline or default_baseline())
            revisions = {"A": baseline, "B": git("rev-parse", "--short", args.candidate)}
            for side, revision in revisions.items():
                export_package(revision, trees / side)
            (trees / "revisions.json").write_bytes(orjson.dumps(revisions))
            if args.export:
                print(f"exported A ({revisions['A']}) and B ({revisions['B']}) into {trees}")
                return 0
        record = measure(trees, revisions, args)
    write_results(RESULTS, **record, machine=machine())
    print_table(record["summary"], revisions)
    return 0


def measure(trees: Path, revisions: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """Serve A and B at once and measure every cell on each, in turn."""
    record: dict[str, Any] = {"revisions": revisions, "args": vars(args), "rows": []}
    record["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    with (
        serving(trees / "A") as a,
        serving(trees / "B") as b,
        ClientPool(max(LEVELS), make_call, preload=callers.PRELOAD) as pool,
    ):
        sides = {"A": a, "B": b}
        record["maps_client_segments"] = {
            name: maps_client_segments(pool, side) for name, side in sides.items()
        }
        print(f"{revisions}: map client segments {record['maps_client_segments']}", flush=True)
        for repeat in range(args.repeats):
            order = ("A", "B") if repeat % 2 == 0 else ("B", "A")
            for protocol, endpoint in PROTOCOLS.items():
                for clients in LEVELS:
                    for name in order:
                        side = sides[name]
                        spec = spec_for(protocol, side, endpoint)
                        row = pool.measure(spec, clients, args.seconds, tree(side))
                        pool.release()
                        row.update(side=name, protocol=protocol, repeat=repeat)
                        record["rows"].append(row)
                        print(
                            f"repeat {repeat} {protocol:16} c={clients:<2} {name}: "
                            f"{row['rps']:8.1f} req/s, p50 {row.get('p50_ms', 0):.2f} ms"
                            + (f", {row['errors']} errors" if row["errors"] else ""),
                            flush=True,
                        )
    record["summary"] = summary(record["rows"])
    return record


def make_call(spec: dict[str, Any], shared: dict[str, Any]) -> Call:
    """bench_peers' calls, and KServe system shared memory over HTTP beside them."""
    if spec["protocol"] == "kserve-shm-rest":
        return callers.kserve_shm(spec, callers.Payload(spec), rest=True)
    return callers.make_call(spec, shared)


def git(*argv: str) -> str:
    return subprocess.run(
        ["git", *argv], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def default_baseline() -> str:
    added = git("log", "--diff-filter=A", "--format=%H", "--", INTRODUCED).splitlines()
    if not added:
        raise SystemExit(f"{INTRODUCED} is not committed yet: name --baseline")
    return git("rev-parse", "--short", f"{added[-1]}^")


@contextlib.contextmanager
def serving(root: Path) -> Iterator[Appliance]:
    """An appliance run from the tree at ``root`` (its own cwd and python_path)."""
    identity = [m for m in appliance_models(umbridge=False) if m["name"] == "identity"]
    sections = appliance_sections()
    sections["mip"]["listeners"] = [{"port": 0, "model": "identity"}]
    config = make_config(new_run_dir(), identity, **sections)
    config["server"]["python_path"] = [str(root)]
    run_dir = Path(config["server"]["run_dir"])
    (run_dir / "config.toml").write_text(tomli_w.dumps(config))
    log_path = run_dir / "appliance.log"
    with log_path.open("wb") as log:
        # cwd first on sys.path (python -m), and children inherit it: the
        # whole tree imports the appliance package found under ``root``.
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance", "serve", "--config", str(run_dir / "config.toml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
        )
    appliance = Appliance(run_dir, process, log_path)
    try:
        appliance.wait_ready()
        yield appliance
    finally:
        try:
            appliance.stop()
            appliance.assert_clean()
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


def spec_for(protocol: str, side: Appliance, endpoint: str) -> dict[str, Any]:
    port = side.ports[endpoint]
    return {"protocol": protocol, "model": "identity", "nbytes": MiB, "url": f"127.0.0.1:{port}"}


_TREES: dict[int, ProcessTree] = {}


def tree(side: Appliance) -> ProcessTree:
    pid = side.process.pid
    if pid not in _TREES:
        _TREES[pid] = ProcessTree(pid)
    return _TREES[pid]


def maps_client_segments(pool: ClientPool, side: Appliance) -> bool:
    """Whether a frontend of ``side`` maps a client's segment after a few requests.

    The callers name their segments ``/pb<pid>_...`` (gRPC) and ``/pr<pid>_...`` (HTTP).
    """
    mapped = False
    for protocol, endpoint in PROTOCOLS.items():
        pool.measure(spec_for(protocol, side, endpoint), 1, 0.3, None, warmup_s=0.1)
        for process in side.processes():
            if not process["pid"] or not process["role"].startswith(("http", "grpc")):
                continue
            with contextlib.suppress(OSError):
                maps = Path(f"/proc/{process['pid']}/maps").read_text()
                mapped |= "/dev/shm/pb" in maps or "/dev/shm/pr" in maps
        pool.release()
    return mapped


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per protocol and concurrency: median req/s and p50 of A and B, and B/A."""
    cells: list[dict[str, Any]] = []
    for protocol in PROTOCOLS:
        for clients in LEVELS:
            cell: dict[str, Any] = {"protocol": protocol, "clients": clients}
            for name in ("A", "B"):
                mine = [
                    r
                    for r in rows
                    if r["protocol"] == protocol
                    and r["concurrency"] == clients
                    and r["side"] == name
                ]
                cell[f"{name}_rps"] = statistics.median(r["rps"] for r in mine)
                cell[f"{name}_p50_ms"] = statistics.median(r.get("p50_ms", 0.0) for r in mine)
                cell[f"{name}_cpu_us"] = statistics.median(r["server_cpu_us"] for r in mine)
                cell[f"{name}_errors"] = sum(r["errors"] for r in mine)
            cell["ratio"] = cell["B_rps"] / cell["A_rps"] if cell["A_rps"] else 0.0
            cells.append(cell)
    return cells


def print_table(cells: list[dict[str, Any]], revisions: dict[str, str]) -> None:
    print(f"\nA = {revisions['A']}, B = {revisions['B']}; medians over repeats")
    columns = ("req/s", "p50 ms", "server CPU µs/req")
    heads = " | ".join(f"{side} {column}" for column in columns for side in "AB")
    print(f"| protocol | clients | B/A req/s | {heads} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        print(
            f"| {c['protocol']} | {c['clients']} | {c['ratio']:.2f}x | {c['A_rps']:.1f} | "
            f"{c['B_rps']:.1f} | {c['A_p50_ms']:.2f} | {c['B_p50_ms']:.2f} | "
            f"{c['A_cpu_us']:.0f} | {c['B_cpu_us']:.0f} |"
        )
    worst = min(c["ratio"] for c in cells)
    verdict = "met" if worst >= 0.8 else "MISSED"
    print(f"\ntarget B/A >= 0.8x on every 1 MiB row: {verdict} (lowest {worst:.2f}x)")


if __name__ == "__main__":
    raise SystemExit(main())
