"""CPU per request by process and by thread kind, for any server's process tree.

A :func:`snapshot` reads the CPU time (utime + stime) of every thread of a
list of processes, and its name from /proc/PID/task/TID/comm; two snapshots
around a measurement, diffed by :func:`per_request`, say what each thread
spent per request. The time is /proc/PID/task/TID/schedstat's run time, in
nanoseconds: /proc's stat has the same time in clock ticks (10 ms), which
over a cell of a few thousand requests is a step of several µs per request
in each thread. Its third field, the times the thread was put on a CPU,
says how often it ran: a thread that sleeps for each message and is woken
for the next runs once per wake-up, so runs per request count the wake-ups a
request costs each kind of thread (:func:`runs_per_request`), the cost that
CPU time alone hides on a host where waking a thread, or the idle CPU it
runs on, costs more than the work it is woken for. Each thread is classified
twice:

- its process's *role* (:func:`process_role`, from the process title that
  setproctitle gives the appliance's children, or the command line): the
  appliance's master, HTTP / gRPC / MIP frontends and model workers, Triton's
  tritonserver and Python stubs, the floors' servers;
- its *kind* (:func:`thread_kind`, from the role and the thread's name): the
  frontend's main thread (its event loop), its ZeroMQ I/O threads, grpcio's
  threads, the model worker's main thread and its ZeroMQ I/O threads, ...

so a row can say both "the model worker process" and "its ZeroMQ I/O thread".
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

STUB = "triton_python_backend_stub"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# grpcio's native threads (comm is cut at 15 characters): its event engine's pool,
# timers, the pool's lifeguard, and older cores' executors.
GRPC_THREADS = (
    "event_engine",
    "grpc",
    "lifeguard",
    "default-executo",
    "resolver-execut",
    "timer_manager",
    "executor",
)
FRONTENDS = ("http frontend", "grpc frontend", "mip frontend")
# The order tables list them in; a kind not here follows, sorted.
ROLES = (
    *FRONTENDS,
    "hop client",
    "model worker",
    "master",
    "other",
    "tritonserver",
    "python stub",
)
KINDS = (
    "frontend main",
    "frontend zmq io",
    "grpc event engine",
    "frontend threads",
    "worker main",
    "worker zmq io",
    "worker threads",
    "master",
    "other",
    "tritonserver",
    "python stub",
)


def process_role(title: str, root: bool = False) -> str:
    """The role of a process with this title (its command line joined, or its name).

    ``root``: the process is the root of the tree measured, which tells a
    gunicorn arbiter from its workers when gunicorn has no setproctitle to
    say so (the floors' environment).
    """
    title = title.strip()
    if STUB in title:
        return "python stub"
    if title.split(" ", 1)[0].endswith("tritonserver"):
        return "tritonserver"
    if "appliance: model[" in title or "hop_echo.py" in title:
        return "model worker"
    if "gunicorn: master" in title:
        return "other"
    if "gunicorn: worker" in title or title.startswith("appliance: http"):
        return "http frontend"
    if title.startswith("appliance: grpc[") or "floor_grpc_app.py" in title:
        return "grpc frontend"
    if title.startswith("appliance: mip["):
        return "mip frontend"
    if "appliance serve" in title:
        return "master"
    if "gunicorn" in title:
        return "other" if root else "http frontend"
    return "other"


def thread_kind(role: str, name: str, main: bool) -> str:
    """The kind of a thread named ``name`` (comm) in a process of ``role``; ``main``:
    its id is the process's."""
    if role in FRONTENDS or role == "hop client":
        side = "frontend"
    elif role == "model worker":
        side = "worker"
    else:
        # Triton's threads and its stubs' are counted per process: their names are
        # Triton's internals, and what compares with the appliance is the process.
        return role
    if main:
        return f"{side} main"
    if name.startswith("ZMQbg"):
        return f"{side} zmq io"
    if name.startswith(GRPC_THREADS):
        return "grpc event engine"
    return f"{side} threads"


@dataclass(frozen=True)
class ThreadTime:
    """One thread's CPU so far, and what it is."""

    pid: int
    tid: int
    title: str
    name: str
    role: str
    kind: str
    seconds: float
    # Times it was put on a CPU (schedstat's third field); 0 where unknown.
    runs: int = 0


Snapshot = dict[tuple[int, int], ThreadTime]


def title_of(process: psutil.Process) -> str:
    """The process's title as ps shows it: setproctitle's, else its command line."""
    with contextlib.suppress(psutil.Error):
        line = " ".join(process.cmdline()).strip()
        if line:
            return line
    with contextlib.suppress(psutil.Error):
        return process.name()
    return "?"


def snapshot(
    processes: Iterable[psutil.Process], root_pid: int | None = None, role: str | None = None
) -> Snapshot:
    """CPU so far of every thread of ``processes``; ``role`` overrides the
    classification by title (a process whose title says nothing, as the hop floor's)."""
    out: Snapshot = {}
    for process in processes:
        title = title_of(process)
        its_role = role or process_role(title, process.pid == root_pid)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{process.pid}/task")]
        except OSError:
            continue  # it has exited
        for tid in tids:
            task = f"/proc/{process.pid}/task/{tid}"
            try:
                name = Path(f"{task}/comm").read_text().strip()
                seconds, runs = _cpu_seconds_and_runs(task)
            except (OSError, ValueError, IndexError):
                continue  # it ended between the listing and the reads
            kind = thread_kind(its_role, name, tid == process.pid)
            out[(process.pid, tid)] = ThreadTime(
                process.pid, tid, title, name, its_role, kind, seconds, runs
            )
    return out


def _cpu_seconds_and_runs(task: str) -> tuple[float, int]:
    """A thread's CPU seconds and the times it ran: schedstat's run time (ns) and
    count, else stat's utime + stime (ticks) and no count."""
    with contextlib.suppress(OSError):
        fields = Path(f"{task}/schedstat").read_text().split()
        return int(fields[0]) / 1e9, int(fields[2])
    # The fields after the name, which may hold spaces: utime and stime are 14th and 15th.
    fields = Path(f"{task}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, 0


def by_kind(thread: ThreadTime) -> str:
    return thread.kind


def by_role(thread: ThreadTime) -> str:
    return thread.role


def per_request(
    before: Snapshot,
    after: Snapshot,
    requests: int,
    key: Callable[[ThreadTime], str] = by_kind,
) -> dict[str, float]:
    """CPU µs per request between two snapshots, summed by ``key`` (the kind by default).

    A thread that started in between counts from zero; one that ended takes its
    CPU with it (psutil cannot read a thread that is gone). Every key seen in
    either snapshot is in the result, 0.0 where nothing ran.
    """
    return _grown_per_request(before, after, requests, key, lambda t: t.seconds * 1e6)


def runs_per_request(
    before: Snapshot,
    after: Snapshot,
    requests: int,
    key: Callable[[ThreadTime], str] = by_kind,
) -> dict[str, float]:
    """Times each ``key``'s threads ran (were put on a CPU) per request between two
    snapshots: the wake-ups a request costs them (see the module's docstring); counted
    as :func:`per_request` counts CPU."""
    return _grown_per_request(before, after, requests, key, lambda t: float(t.runs))


def _grown_per_request(
    before: Snapshot,
    after: Snapshot,
    requests: int,
    key: Callable[[ThreadTime], str],
    amount: Callable[[ThreadTime], float],
) -> dict[str, float]:
    """How much ``amount`` of each ``key``'s threads grew between two snapshots, per request."""
    out: dict[str, float] = defaultdict(float)
    for thread in before.values():
        out[key(thread)] += 0.0
    for pair, thread in after.items():
        earlier = before.get(pair)
        grown = amount(thread) - (amount(earlier) if earlier is not None else 0.0)
        out[key(thread)] += max(0.0, grown) / max(1, requests)
    return dict(out)


def ordered(keys: Iterable[str], order: tuple[str, ...] = KINDS + ROLES) -> list[str]:
    """``keys`` in the tables' order: known kinds and roles first, the rest sorted."""
    known = {name: index for index, name in enumerate(dict.fromkeys(order))}
    return sorted(set(keys), key=lambda name: (known.get(name, len(known)), name))


def summed(values: Mapping[str, float], names: Iterable[str]) -> float:
    """The sum of those of ``names`` that ``values`` has."""
    return sum(values.get(name, 0.0) for name in names)
