"""Where a compiled process's CPU goes: perf samples charged to the nearest compiled function.

py-spy sees Python frames only; with the request path compiled by mypyc
(appliance/native.py) a model worker runs a few dozen bytecodes a request and
py-spy has almost nothing to show. ``perf record --call-graph dwarf`` unwinds
through the compiled modules, libpython, libzmq and the kernel alike (no frame
pointers needed), so each sample is charged here to the innermost compiled
function on its stack (``CPyDef_intake___Intake___receive`` shows as
``intake.Intake.receive``): what that function costs, with what it calls
into libpython, the C libraries and the kernel, short of another compiled
function. Under each of the top functions, what its samples ran: the first
frame below it that is not CPython's call machinery.

Starts the appliance as bench_peers.py configures it, drives one load
(bench/loadgen.py) and records the main thread of the one process whose title
holds ``--process``. Needs ``perf`` and leave to trace (root, or
kernel.perf_event_paranoid <= 1). Not run by ``make bench``. Usage::

    python bench/perf_compiled.py --system kserve-rest-json --clients 8 --process "model[identity"
    python bench/perf_compiled.py --system kserve-grpc --clients 8 --process "grpc[0]"
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import callers  # noqa: E402
from bench.bench_peers import appliance_endpoints  # noqa: E402
from bench.loadgen import ClientPool, ProcessTree  # noqa: E402
from bench.plan import SYSTEMS, appliance_models, appliance_sections, spec_for  # noqa: E402
from tests.system.harness import running  # noqa: E402

COMPILED = re.compile(r"^CPy(?:Def|Py)_(?P<name>\w+?)(?:_clear|_setup|_traverse)?$")
# CPython's own call and attribute machinery: looked through to what it ran.
MACHINERY = ("PyObject_", "_PyObject_", "cfunction_", "method_vectorcall", "[unknown]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", default="kserve-rest-json", help="bench/plan.py name")
    parser.add_argument("--payload", default="16B")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--process", default="model[identity", help="a part of its title")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--frequency", type=int, default=999, help="samples per second")
    parser.add_argument("--top", type=int, default=30, help="functions shown")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("perf is not installed (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 1
    with (
        ClientPool(args.clients, callers.make_call, callers.PRELOAD, "forkserver") as pool,
        running(appliance_models(), **appliance_sections()) as appliance,
        tempfile.TemporaryDirectory(prefix="perf-compiled-") as work,
    ):
        spec = spec_for(
            SYSTEMS[args.system], args.payload, {"appliance": appliance_endpoints(appliance)}
        )
        try:
            pool.measure(spec, args.clients, 1.0)  # warm up
            tree = ProcessTree(appliance.process.pid)
            tree.refresh()
            target, title = _find(tree, args.process)
            data = Path(work) / "perf.data"
            argv = ["perf", "record", "-q", "-F", str(args.frequency)]
            argv += ["--call-graph", "dwarf,16384", "-t", str(target.pid), "-o", str(data)]
            argv += ["--", "sleep", str(args.seconds)]
            record = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            row = pool.measure(spec, args.clients, args.seconds, tree)
            _, error = record.communicate(timeout=args.seconds + 120)
            if record.returncode != 0:
                print(f"perf record failed: {error.decode().strip()}", file=sys.stderr)
                return 1
            script = subprocess.run(
                ["perf", "script", "-i", str(data), "-F", "ip,sym"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        finally:
            pool.release()
    print(
        f"{args.system} {args.payload} c={args.clients}: {row['rps']:.0f} req/s; "
        f"main thread of {title!r}, {args.frequency} samples/s"
    )
    report(_stacks(script), row["requests"], args.frequency, args.top)
    return 0


def _find(tree: ProcessTree, part: str) -> tuple[psutil.Process, str]:
    """The process whose title holds ``part``, and its title."""
    for process in tree.processes:
        try:
            title = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if part in title:
            return process, title.strip()
    raise SystemExit(f"no process of the appliance has {part!r} in its title")


def _stacks(script: str) -> list[list[str]]:
    """Each sample's frames, innermost first (perf script's output)."""
    stacks: list[list[str]] = []
    frames: list[str] = []
    for line in script.splitlines():
        if not line.strip():
            if frames:
                stacks.append(frames)
            frames = []
            continue
        parts = line.split(None, 1)
        frames.append(parts[1].split("+0x")[0] if len(parts) > 1 else "")
    if frames:
        stacks.append(frames)
    return stacks


def _compiled(frame: str) -> str | None:
    match = COMPILED.match(frame)
    if match is None:
        return None
    module, _, rest = match["name"].partition("___")
    return f"{module}.{rest.replace('___', '.')}" if rest else module


def report(stacks: list[list[str]], requests: int, frequency: int, top: int) -> None:
    owners: Counter[str] = Counter()
    under: dict[str, Counter[str]] = defaultdict(Counter)
    for frames in stacks:
        owner, below = "(no compiled function)", frames
        for depth, frame in enumerate(frames):
            name = _compiled(frame)
            if name is not None:
                owner, below = name, frames[:depth]
                break
        owners[owner] += 1
        ran = [f for f in reversed(below) if f and not f.startswith(MACHINERY)]
        under[owner][ran[0] if ran else "(itself)"] += 1
    every = len(stacks) or 1
    per_request = 1e6 / frequency / max(1, requests)
    print(
        f"{every} samples, {requests} requests: µs per request, share, innermost compiled function"
    )
    for owner, count in owners.most_common(top):
        print(f"  {count * per_request:7.2f}  {count / every:6.1%}  {owner}")
    print(
        "\nwhat the top ten ran (the first frame below them that is not CPython's call machinery):"
    )
    for owner, _count in owners.most_common(10):
        ran = ", ".join(f"{name} {n / every:.1%}" for name, n in under[owner].most_common(4))
        print(f"  {owner}: {ran}")
    # Where the time lands, whoever called: memcpy, a system call, the interpreter's loop.
    leaves = Counter(frames[0] if frames and frames[0] else "[unknown]" for frames in stacks)
    print("\nthe innermost frames (where the samples landed, whatever called them):")
    for leaf, count in leaves.most_common(top):
        print(f"  {count * per_request:7.2f}  {count / every:6.1%}  {leaf}")


if __name__ == "__main__":
    sys.exit(main())
