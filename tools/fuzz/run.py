"""Fuzz every codec for a bounded time each: ``make fuzz`` runs ``python -m tools.fuzz.run``.

Each target (tools/fuzz/targets.py) runs in a process of its own, for
``--seconds`` (60 by default), with atheris (coverage-guided libFuzzer)
when it is installed, else with hypothesis generating mutations of the
seeds for the same time. Per input: only the protocol's own errors, memory
in proportion to the input and no near-hang (tools/fuzz/oracle.py);
libFuzzer adds a per-input timeout and an RSS limit.

Under ``--out`` (build/fuzz) each target keeps ``seeds/`` (real messages,
written by a separate process: see targets.ISOLATED), ``corpus/`` (what
atheris found, kept between runs) and any ``crash-*`` input. The run ends
with a table and exits 1 if any target failed. Reproduce a crash with
``python -m tools.fuzz.run --replay TARGET FILE``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from tools.fuzz import oracle
from tools.fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
_EXECS = re.compile(rb"(?:stat::number_of_executed_units:|executions:)\s*(\d+)")


def _have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def write_seeds(name: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(TARGETS[name].seeds()):
        (directory / f"seed-{index}").write_bytes(seed)


def _read_dir(directory: Path) -> list[bytes]:
    return [path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()]


def run_atheris(name: str, seconds: int, out: Path) -> None:
    import atheris

    target = TARGETS[name]
    seeds = _read_dir(out / "seeds")
    tracemalloc.start()
    # The codec modules are imported by their first call: instrument them.
    with atheris.instrument_imports(include=["appliance"]):
        for seed in seeds:
            oracle.checked(target.run, seed)
    corpus = out / "corpus"
    corpus.mkdir(exist_ok=True)
    dictionary = []
    if target.words:
        # libFuzzer's dictionary format: one quoted token a line.
        lines = [
            '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"' for word in target.words
        ]
        (out / "dictionary").write_text("\n".join(lines) + "\n")
        dictionary = [f"-dict={out / 'dictionary'}"]
    argv = [
        sys.argv[0],
        *dictionary,
        f"-max_total_time={seconds}",
        "-timeout=20",
        "-rss_limit_mb=4096",
        "-max_len=65536",
        "-print_final_stats=1",
        f"-artifact_prefix={out}/",
        str(corpus),
        str(out / "seeds"),
    ]
    atheris.Setup(argv, lambda data: oracle.checked(target.run, data))
    atheris.Fuzz()


def run_hypothesis(name: str, seconds: int, out: Path) -> None:
    from hypothesis import HealthCheck, given, settings

    target = TARGETS[name]
    seeds = _read_dir(out / "seeds")
    tracemalloc.start()
    executions = 0

    @settings(
        max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(oracle.inputs(seeds, target.words))
    def one(data: bytes) -> None:
        nonlocal executions
        executions += 1
        try:
            oracle.checked(target.run, data)
        except BaseException:
            # The last failing input is the shrunk one hypothesis replays.
            (out / "crash-hypothesis").write_bytes(data)
            raise

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        one()
    print(f"executions: {executions}", flush=True)


def replay(name: str, path: Path) -> None:
    tracemalloc.start()
    oracle.checked(TARGETS[name].run, path.read_bytes())
    print(f"{name}: {path} passes")


def _child(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tools.fuzz.run", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, timeout=timeout, check=False
    )


def fuzz(name: str, seconds: int, engine: str, out: Path) -> tuple[str, int, str]:
    """Fuzz one target in a child process; return (result, executions, detail)."""
    seeded = _child("--write-seeds", name, str(out / "seeds"), timeout=300)
    if seeded.returncode:
        return "ERROR", 0, seeded.stderr.decode(errors="replace")[-2000:]
    try:
        done = _child("--worker", name, "--engine", engine, "--seconds", str(seconds),
                      "--out", str(out), timeout=2 * seconds + 120)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "HANG", 0, f"the {engine} worker did not stop after {2 * seconds + 120} s"
    log = done.stdout + done.stderr
    (out / f"{engine}.log").write_bytes(log)
    found = _EXECS.findall(log)
    executions = int(found[-1]) if found else 0
    if done.returncode:
        crashes = sorted(str(path) for path in out.glob("crash-*"))
        tail = log.decode(errors="replace")[-3000:]
        return "FAILED", executions, f"{', '.join(crashes)}\n{tail}"
    return "ok", executions, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    parser.add_argument("--engine", choices=["auto", "atheris", "hypothesis"], default="auto")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "fuzz")
    parser.add_argument("--write-seeds", nargs=2, metavar=("TARGET", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--worker", metavar="TARGET", help=argparse.SUPPRESS)
    parser.add_argument("--replay", nargs=2, metavar=("TARGET", "FILE"))
    args = parser.parse_args(argv)
    if args.write_seeds:
        write_seeds(args.write_seeds[0], Path(args.write_seeds[1]))
        return 0
    if args.replay:
        replay(args.replay[0], Path(args.replay[1]))
        return 0
    if args.worker:
        worker = run_atheris if args.engine == "atheris" else run_hypothesis
        worker(args.worker, args.seconds, args.out)
        return 0
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown targets {unknown}; the targets are {', '.join(TARGETS)}")
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if _have_atheris() else "hypothesis"
    print(f"fuzzing with {engine}, {args.seconds} s per target; results in {args.out}")
    failed = False
    rows = []
    for name in args.targets or list(TARGETS):
        started = time.monotonic()
        result, executions, detail = fuzz(name, args.seconds, engine, args.out / name)
        rows.append((name, result, executions, time.monotonic() - started))
        print(f"{name:12} {result:7} {executions:>10} inputs  {rows[-1][3]:6.0f} s", flush=True)
        if detail:
            failed = True
            print(detail, flush=True)
    print(f"\n{'target':12} {'result':7} {'inputs':>10}")
    for name, result, executions, _elapsed in rows:
        print(f"{name:12} {result:7} {executions:>10}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
