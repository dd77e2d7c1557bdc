"""Load generation and statistics shared by every benchmark in bench/.

Two ways to drive a server, one set of statistics:

- :class:`ClientPool`: client processes, each running a closed loop (one
  request in flight per thread, the next sent when the reply is in) for a
  fixed time, or a paced loop at a fixed offered rate. The first
  ``concurrency`` processes take part in a measurement; each process builds
  its calls once per target (connections, shared-memory regions) and keeps
  them until :meth:`ClientPool.release`. While they run, the pool samples the
  CPU time of the server's whole process tree with psutil, so every row
  carries server CPU per request, which does not depend on how much of the
  2 vCPUs the Python load generator itself takes.
- :func:`thread_loop`: threads of this process, a fixed number of calls each
  (the micro-benchmarks' round trips).

Rows are plain dicts (``requests``, ``rps``, ``p50_ms``/``p99_ms`` or the
``_us`` forms, ...); :func:`median_row` takes medians over repeats, and
:func:`write_results` writes a result file with the machine's description.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil

from bench import threads as thread_cpu
from bench.client_process import OVERRUN_S, Call, MakeCall, client_main

WARMUP_S = 0.3
REPLY_GRACE_S = 120.0  # the longest one request may run past the end of a measurement


def tensor(nbytes: int) -> np.ndarray[Any, Any]:
    """Return a reproducible FP32 [1, nbytes/4] tensor."""
    count = max(1, nbytes // 4)
    return np.random.default_rng(0).random(count, dtype=np.float32).reshape(1, count)


def latency_stats(
    latencies: Sequence[float], elapsed_s: float, unit: str = "us"
) -> dict[str, float]:
    """Summarise latencies (seconds) observed over ``elapsed_s``; ``unit`` is us or ms."""
    scale = {"us": 1e6, "ms": 1e3}[unit]
    ordered = sorted(latencies)
    done = len(ordered)
    if not done:
        nan = math.nan
        names = ("p50", "p99", "mean", "max")
        return {"requests": 0, "rps": 0.0, **{f"{name}_{unit}": nan for name in names}}
    return {
        "requests": done,
        "rps": done / elapsed_s,
        f"p50_{unit}": ordered[done // 2] * scale,
        f"p99_{unit}": ordered[min(done - 1, int(done * 0.99))] * scale,
        f"mean_{unit}": statistics.fmean(ordered) * scale,
        f"max_{unit}": ordered[-1] * scale,
    }


def median_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Return the median of every numeric key over repeats (others from the first row);
    a dict of numbers (``threads_us``) gets the median of each of its keys."""
    merged: dict[str, Any] = {}
    for key, first in rows[0].items():
        if isinstance(first, dict) and all(
            isinstance(v, int | float) for row in rows for v in (row.get(key) or {}).values()
        ):
            merged[key] = _median_dict([row.get(key) or {} for row in rows])
            continue
        values = [row[key] for row in rows if isinstance(row.get(key), int | float)]
        if isinstance(first, bool) or not values:
            merged[key] = first
            continue
        finite = [v for v in values if not math.isnan(v)]
        merged[key] = statistics.median(finite) if finite else math.nan
    return merged


def _median_dict(dicts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median of each key; a key a repeat lacks counts 0 there (nothing of that
    kind ran)."""
    keys = dict.fromkeys(k for d in dicts for k in d)
    return {k: statistics.median(float(d.get(k, 0.0)) for d in dicts) for k in keys}


def machine() -> dict[str, Any]:
    """Describe this machine for a result file."""
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def print_cells(table: dict[str, dict[str, dict[str, Any]]]) -> None:
    """Print a cell-by-server table of median rows (latency, req/s, server CPU)."""
    print("\nmedians over rounds; server CPU per request is the server's whole process tree")
    print("| cell | server | p50 ms | p99 ms | req/s | server CPU µs/req |")
    print("|---|---|---|---|---|---|")
    for cell, rows in table.items():
        for server, row in rows.items():
            print(
                f"| {cell} | {server} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
                f"{row['rps']:.0f} | {row['server_cpu_us']:.0f} |"
            )


def write_results(path: Path, **payload: Any) -> None:
    """Write ``payload`` and the machine's description as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"machine": machine(), **payload}
    path.write_bytes(
        orjson.dumps(
            body, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
        )
        + b"\n"
    )


# -- threads of this process, a fixed number of calls ----------------------------


def thread_loop(
    make_call: Callable[[int], Call],
    count: int,
    inflight: int,
    warmup: int = 0,
    unit: str = "us",
) -> dict[str, float]:
    """Run ``count`` calls from ``inflight`` threads, one in flight per thread.

    Each thread builds its call with ``make_call(index)`` and makes ``warmup``
    untimed calls; then all start together and the clock runs until the last
    thread is done.
    """
    per_thread = max(1, count // inflight)
    latencies: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(inflight + 1)

    def worker(index: int) -> None:
        mine: list[float] = []
        try:
            call = make_call(index)
            for _ in range(warmup):
                call()
        except BaseException as error:
            failures.append(error)
            barrier.abort()
            return
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        try:
            for _ in range(per_thread):
                start = time.perf_counter()
                call()
                mine.append(time.perf_counter() - start)
        except BaseException as error:
            failures.append(error)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(inflight)]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if failures:
        raise failures[0]
    return {**latency_stats(latencies, elapsed, unit), "elapsed_s": elapsed}


# -- server CPU ---------------------------------------------------------------


class ProcessTree:
    """The CPU time of a process and all its descendants, as psutil sees them.

    :meth:`refresh` lists the tree (psutil walks every process on the host
    for that); :meth:`cpu_seconds` then reads only the listed processes, so
    a sample taken while 64 clients compete for the CPU stays short and
    lands when it is taken. A process that exits between the two takes its
    CPU time with it. :meth:`thread_times` reads the same processes thread
    by thread (bench/threads.py).
    """

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.processes: list[psutil.Process] = []

    def refresh(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            self.processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            self.processes = []

    def cpu_seconds(self) -> float:
        """Return user + system seconds of every listed process that still runs."""
        if not self.processes:
            self.refresh()
        if not self.processes:
            return math.nan
        total = 0.0
        for process in self.processes:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def thread_times(self) -> thread_cpu.Snapshot:
        """CPU so far of every thread of the listed processes, classified."""
        if not self.processes:
            self.refresh()
        return thread_cpu.snapshot(self.processes, self.root_pid)


# -- client processes -----------------------------------------------------------


class ClientPool:
    """Client processes that each run a closed (or paced) loop on command."""

    def __init__(
        self,
        size: int,
        make_call: MakeCall,
        preload: Iterable[str] = (),
        method: str = "spawn",
        start_timeout_s: float = 300.0,
    ) -> None:
        """Start ``size`` client processes and wait until each has imported ``preload``.

        ``method`` "forkserver" imports ``preload`` once in the fork server, so
        many clients start in seconds instead of each importing its own.
        """
        context = mp.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(["bench.client_process", *preload])
        pipes = [context.Pipe() for _ in range(size)]
        self.processes = [
            context.Process(
                target=client_main, args=(child, make_call, tuple(preload)), daemon=True
            )
            for _parent, child in pipes
        ]
        for process in self.processes:
            process.start()
        self.conns: list[Connection] = [parent for parent, _child in pipes]
        try:
            for conn in self.conns:
                _expect(conn, "ready", start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def size(self) -> int:
        return len(self.conns)

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def measure(
        self,
        spec: Any,
        concurrency: int,
        seconds: float,
        server: ProcessTree | None = None,
        rate: float | None = None,
        warmup_s: float = WARMUP_S,
    ) -> dict[str, Any]:
        """Run ``concurrency`` loops against ``spec`` for ``seconds``; return one row.

        Loops are spread over the pool's processes (threads within a process
        once there are more loops than processes). ``rate`` (requests/s in
        all) paces the loops instead of a closed loop; latency then counts
        from each request's scheduled time, so a server that falls behind is
        charged for the wait (no coordinated omission).

        With ``server``, the row has its CPU per request: the whole tree's
        (``server_cpu_us``), by thread kind (``threads_us``) and by process
        role (``processes_us``), all sampled at the same two moments.
        """
        shares = _spread(concurrency, self.size)
        active = [(conn, n) for conn, n in zip(self.conns, shares, strict=True) if n]
        for conn, threads in active:
            conn.send(("prepare", spec, threads))
        setup_errors = [_reply(conn, REPLY_GRACE_S) for conn, _ in active]
        if server is not None:
            server.refresh()
        start_at = time.time() + warmup_s
        stop_at = start_at + seconds
        interval = concurrency / rate if rate else 0.0
        slot = 0
        for conn, threads in active:
            conn.send(("run", spec, threads, start_at, stop_at, interval, slot, concurrency))
            slot += threads
        time.sleep(max(0.0, start_at - time.time()))
        cpu_began = time.time()
        cpu_before = server.cpu_seconds() if server else math.nan
        threads_before = server.thread_times() if server else {}
        replies = [_reply(conn, seconds + OVERRUN_S + REPLY_GRACE_S) for conn, _ in active]
        cpu = (server.cpu_seconds() - cpu_before) if server else math.nan
        threads_after = server.thread_times() if server else {}
        cpu_span = time.time() - cpu_began
        ended = max((r["last_end"] for r in replies), default=0.0)
        # A slow cell runs on until every loop has a measured request (OVERRUN_S at most).
        elapsed = max(seconds, ended - start_at)
        row = _row(replies, setup_errors, concurrency, elapsed, (cpu, cpu_span), rate)
        if server is not None:
            done = row["requests"]
            row["threads_us"] = thread_cpu.per_request(threads_before, threads_after, done)
            row["processes_us"] = thread_cpu.per_request(
                threads_before, threads_after, done, thread_cpu.by_role
            )
            row["threads_runs"] = thread_cpu.runs_per_request(threads_before, threads_after, done)
            row["processes_runs"] = thread_cpu.runs_per_request(
                threads_before, threads_after, done, thread_cpu.by_role
            )
        return row

    def release(self) -> None:
        """Close every call the clients hold (connections, regions)."""
        for conn in self.conns:
            conn.send(("release",))
        for conn in self.conns:
            _reply(conn, REPLY_GRACE_S)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(5)


def mode_call(caller_class: type, spec: tuple[Any, ...], shared: dict[str, Any]) -> Call:
    """A make_call (bind ``caller_class`` with functools.partial) for mode sweeps.

    ``spec`` is ``(mode, nbytes, *args)``: each client process makes one
    ``caller_class(*args)`` and calls ``caller.call(mode, tensor(nbytes))``.
    """
    mode, nbytes, *args = spec
    if "caller" not in shared:
        shared["caller"] = caller_class(*args)
    caller, x = shared["caller"], tensor(nbytes)
    return lambda: caller.call(mode, x)


def mode_grid(
    pool: ClientPool,
    modes: Sequence[str],
    sizes: dict[str, int],
    args: Sequence[Any],
    seconds: float,
    repeats: int,
    server: ProcessTree | None = None,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Measure every mode and size with the whole pool, repeats outermost.

    Specs are ``(mode, nbytes, *args)`` (see :func:`mode_call`); any failed
    request stops the benchmark with its message.
    """
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {s: [] for s in sizes} for m in modes}
    for repeat in range(repeats):
        print(f"repeat {repeat + 1}/{repeats}", file=sys.stderr)
        for size, nbytes in sizes.items():
            for mode in modes:
                row = pool.measure((mode, nbytes, *args), pool.size, seconds, server)
                if row["errors"]:
                    raise RuntimeError(f"{mode} {size}: {row['error']}")
                row["mbps"] = row["requests"] * nbytes / row["seconds"] / 1e6
                runs[mode][size].append(row)
    return runs


def _spread(concurrency: int, size: int) -> list[int]:
    threads = math.ceil(concurrency / size)
    processes = math.ceil(concurrency / threads)
    shares = [threads] * (concurrency // threads)
    if concurrency % threads:
        shares.append(concurrency % threads)
    return shares + [0] * (size - processes)


def _expect(conn: Connection, what: str, timeout_s: float) -> None:
    reply = _reply(conn, timeout_s)
    if reply != what:
        raise RuntimeError(f"a client process answered {reply!r}, expected {what!r}")


def _reply(conn: Connection, timeout_s: float) -> Any:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"a client process did not answer within {timeout_s:.0f} s")
    return conn.recv()


def _row(
    replies: list[Any],
    setup_errors: list[str | None],
    concurrency: int,
    seconds: float,
    server_cpu: tuple[float, float],
    rate: float | None,
) -> dict[str, Any]:
    """One measurement's row; ``server_cpu`` is (CPU seconds, over how many seconds)."""
    latencies = array("d")
    errors = 0
    messages = [e for e in setup_errors if e]
    client_cpu_s = 0.0
    for reply in replies:
        latencies.frombytes(reply["latencies"])
        errors += reply["errors"]
        client_cpu_s += reply["cpu_s"]
        messages += reply["messages"]
    row: dict[str, Any] = {"concurrency": concurrency, "seconds": seconds}
    if rate:
        row["offered_rps"] = rate
    row.update(latency_stats(latencies, seconds, "ms"))
    done = max(1, row["requests"])
    row["errors"] = errors + len([e for e in setup_errors if e])
    row["error"] = messages[0] if messages else None
    row["server_cpu_us"] = server_cpu[0] / done * 1e6
    row["server_cores"] = server_cpu[0] / server_cpu[1]
    row["client_cpu_us"] = client_cpu_s / done * 1e6
    return row


def round_arguments(description: str, quick_seconds: float) -> argparse.Namespace:
    """The command line of a benchmark run in interleaved rounds: ``--seconds`` a cell,
    ``--rounds``, and ``--quick`` (``quick_seconds`` a cell, one round)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=3.0, help="per cell")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = quick_seconds, 1
    return args


@contextlib.contextmanager
def appliance_serving(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The appliance with ``config`` (tests/system/harness.py's), as a benchmark's
    server: its KServe addresses and its pid (whose process tree is measured)."""
    from tests.system.harness import serving

    with serving(config) as served:
        urls = {kind: f"127.0.0.1:{served.ports[kind]}" for kind in ("http", "grpc")}
        yield {"urls": urls, "pid": served.process.pid}


def export_package(revision: str, directory: Path) -> None:
    """Write the appliance package at git ``revision`` into ``directory`` (git archive):
    an appliance run from there (its cwd) imports that package, for A/B runs of two commits."""
    directory.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "appliance"],
        cwd=Path(__file__).resolve().parents[1],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
