"""The floor of the hop: a descriptor-sized round trip over ZeroMQ against a plain socket.

The appliance's frontend hands each request to a model worker as a small
message and waits for a small reply; both ends are Python, the frontend an
event loop (uvloop) and the worker a blocking loop. This measures that hop
alone, with nothing else in either process, driven as the appliance drives
it, on two transports:

- ``zmq``: PUSH -> PULL there and PUSH -> PULL back over ipc, one context
  (one I/O thread, under the appliance's default scheduling policy:
  ``HELPERS_BATCH``, see appliance/processes/helper_threads.py) per process;
  the client watches its socket's FD in the loop and reads while ZMQ_EVENTS
  says POLLIN; the worker polls, then reads what is waiting. What the
  appliance does (client/aio.py, worker/server.py).
- ``unix``: one AF_UNIX SOCK_SEQPACKET pair, each message one datagram; the
  client's loop watches the FD and reads until EAGAIN; the worker blocks in
  poll() and reads until EAGAIN. No I/O threads: the kernel's socket is the
  queue.

Each cell runs ``inflight`` coroutines, each in a closed loop (send a 96-byte
message with its id, await the reply); CPU per round trip is bench/threads.py's, per
thread, for both processes (ZeroMQ's ZMQbg/IO threads apart). The rows say
what the hop costs before any request handling, and how much of it the I/O
threads are. Rounds interleave the transports; medians over rounds go to
bench/results/hop_floor.json. Usage::

    python bench/bench_hop_floor.py [--seconds S] [--rounds R] [--quick]

Each row also has ``threads_us`` and ``processes_us`` in bench/threads.py's
kinds (the client's threads as a frontend's, the worker's as a model
worker's), so bench_peers.py and ab.py put a cell of it beside the
appliance's threads: :func:`measure_apart` runs :func:`measure` in a fresh
interpreter (``--cell TRANSPORT INFLIGHT SECONDS``, the row as JSON on stdout).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
import psutil
import uvloop
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from appliance.config.settings import ServerConfig  # noqa: E402
from appliance.processes.helper_threads import zmq_context  # noqa: E402
from bench import threads  # noqa: E402
from bench.loadgen import median_row, round_arguments, write_results  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "hop_floor.json"
TRANSPORTS = ("zmq", "unix")
INFLIGHT = (1, 16)
MESSAGE = 96  # bytes: about what one request's descriptor takes
_ID = struct.Struct("<Q")
WARMUP_S = 0.3
# The floor starts its helper threads as the appliance does by default.
HELPERS_BATCH = ServerConfig().helper_threads_batch


# -- the worker's side: a blocking loop answering each message --------------------


def _zmq_worker(where: str, ready: Any) -> None:
    context = zmq_context(HELPERS_BATCH)
    inbox = context.socket(zmq.PULL)
    inbox.bind(f"ipc://{where}/in")
    outbox = context.socket(zmq.PUSH)
    outbox.connect(f"ipc://{where}/out")
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    ready.send("ready")
    while True:
        if not poller.poll(1000):
            continue
        while cast(int, inbox.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frame = inbox.recv(zmq.NOBLOCK)
            if frame == b"stop":
                return
            outbox.send(frame[: _ID.size] + bytes(MESSAGE - _ID.size))


def _unix_worker(sock: socket.socket, ready: Any) -> None:
    sock.setblocking(False)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    ready.send("ready")
    while True:
        if not poller.poll(1000):
            continue
        while True:
            try:
                frame = sock.recv(4096)
            except BlockingIOError:
                break
            if frame == b"stop":
                return
            sock.send(frame[: _ID.size] + bytes(MESSAGE - _ID.size))


# -- the frontend's side: an event loop with many requests awaiting replies -------


class _Client:
    """Send a message, await its reply; replies matched by the id in their first bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.next_id = 0
        self.send: Callable[[bytes], object] = lambda frame: None

    def answer(self, frame: bytes) -> None:
        future = self.waiting.pop(_ID.unpack_from(frame)[0], None)
        if future is not None and not future.done():
            future.set_result(None)

    async def call(self) -> None:
        self.next_id += 1
        key = self.next_id
        future = self.loop.create_future()
        self.waiting[key] = future
        self.send(_ID.pack(key) + bytes(MESSAGE - _ID.size))
        await future


def _zmq_client(client: _Client, where: str) -> Callable[[], None]:
    context = zmq_context(HELPERS_BATCH)
    outbox = context.socket(zmq.PUSH)
    outbox.connect(f"ipc://{where}/in")
    inbox = context.socket(zmq.PULL)
    inbox.bind(f"ipc://{where}/out")

    def drain() -> None:
        while cast(int, inbox.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            client.answer(inbox.recv(zmq.NOBLOCK))

    client.send = outbox.send
    fd = cast(int, inbox.getsockopt(zmq.FD))
    client.loop.add_reader(fd, drain)

    def close() -> None:
        client.loop.remove_reader(fd)
        outbox.send(b"stop")
        outbox.close(linger=1000)
        inbox.close(linger=0)
        context.term()

    return close


def _unix_client(client: _Client, sock: socket.socket) -> Callable[[], None]:
    sock.setblocking(False)

    def drain() -> None:
        while True:
            try:
                frame = sock.recv(4096)
            except BlockingIOError:
                return
            client.answer(frame)

    client.send = sock.send
    client.loop.add_reader(sock.fileno(), drain)

    def close() -> None:
        client.loop.remove_reader(sock.fileno())
        sock.setblocking(True)
        sock.send(b"stop")
        sock.close()

    return close


# -- measuring ---------------------------------------------------------------------


def _threads(process: psutil.Process, role: str) -> threads.Snapshot:
    """CPU so far of each thread, as a frontend's (``hop client``) or a model worker's."""
    return threads.snapshot([process], process.pid, role)


async def _run(client: _Client, inflight: int, seconds: float) -> int:
    done = 0
    stop_at = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await client.call()
            done += 1

    await asyncio.gather(*(loop() for _ in range(inflight)))
    return done


def measure(transport: str, inflight: int, seconds: float) -> dict[str, Any]:
    """One cell: a fresh worker process and client, warmed up, then measured."""
    forked = mp.get_context("fork")
    ready_here, ready_there = forked.Pipe()
    loop = uvloop.new_event_loop()
    client = _Client(loop)
    with tempfile.TemporaryDirectory(prefix="hop-floor-") as where:
        if transport == "zmq":
            worker = forked.Process(target=_zmq_worker, args=(where, ready_there))
            worker.start()
            close = _zmq_client(client, where)
        else:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            worker = forked.Process(target=_unix_worker, args=(theirs, ready_there))
            worker.start()
            theirs.close()
            close = _unix_client(client, mine)
        try:
            if not ready_here.poll(30):
                raise RuntimeError(f"the {transport} worker did not start")
            ready_here.recv()
            loop.run_until_complete(_run(client, inflight, WARMUP_S))
            here, there = psutil.Process(os.getpid()), psutil.Process(worker.pid)
            before = {**_threads(here, "hop client"), **_threads(there, "model worker")}
            started = time.perf_counter()
            count = loop.run_until_complete(_run(client, inflight, seconds))
            elapsed = time.perf_counter() - started
            after = {**_threads(here, "hop client"), **_threads(there, "model worker")}
        finally:
            close()
            worker.join(10)
            if worker.is_alive():
                worker.kill()
            loop.close()
    kinds = threads.per_request(before, after, count)
    row: dict[str, Any] = {
        "transport": transport,
        "inflight": inflight,
        "round_trips": count,
        "rps": count / elapsed,
        "client_python_us": kinds.get("frontend main", 0.0) + kinds.get("frontend threads", 0.0),
        "client_io_us": kinds.get("frontend zmq io", 0.0),
        "worker_python_us": kinds.get("worker main", 0.0) + kinds.get("worker threads", 0.0),
        "worker_io_us": kinds.get("worker zmq io", 0.0),
    }
    sides = ("client", "worker")
    row["total_us"] = sum(row[f"{s}_{k}_us"] for s in sides for k in ("python", "io"))
    # The names a row of bench/loadgen.py has, so tables put the two side by side.
    row |= {"concurrency": inflight, "requests": count, "errors": 0}
    row["server_cpu_us"] = row["total_us"]
    row["threads_us"] = kinds
    row["processes_us"] = threads.per_request(before, after, count, threads.by_role)
    row["threads_runs"] = threads.runs_per_request(before, after, count)
    row["processes_runs"] = threads.runs_per_request(before, after, count, threads.by_role)
    return row


def measure_apart(transport: str, inflight: int, seconds: float) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter: the caller's own threads (a benchmark's
    grpc or psutil) stay out of the client's count, and its fork sees no grpc state."""
    argv = [sys.executable, __file__, "--cell", transport, str(inflight), str(seconds)]
    done = subprocess.run(argv, capture_output=True, check=False, timeout=seconds + 120)
    if done.returncode:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"the hop floor's {transport} cell failed: {tail}")
    row: dict[str, Any] = orjson.loads(done.stdout)
    return row


def report(table: list[dict[str, Any]]) -> None:
    print("\nmedians over rounds; CPU µs per round trip, both processes, by thread")
    print(
        "| transport | in flight | round trips/s | client Python | client I/O thread "
        "| worker Python | worker I/O thread | total | total / unix |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    plain = {row["inflight"]: row["total_us"] for row in table if row["transport"] == "unix"}
    for row in table:
        ratio = row["total_us"] / plain[row["inflight"]] if row["inflight"] in plain else 0.0
        print(
            f"| {row['transport']} | {row['inflight']} | {row['rps']:.0f} | "
            f"{row['client_python_us']:.1f} | {row['client_io_us']:.1f} | "
            f"{row['worker_python_us']:.1f} | {row['worker_io_us']:.1f} | "
            f"{row['total_us']:.1f} | {ratio:.2f}x |"
        )


def main() -> int:
    if sys.argv[1:2] == ["--cell"]:
        transport, inflight, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        sys.stdout.buffer.write(orjson.dumps(measure(transport, inflight, seconds)))
        return 0
    args = round_arguments(__doc__.split("\n")[0], 0.5)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr)
        order = TRANSPORTS if round_ % 2 == 0 else TRANSPORTS[::-1]
        for inflight in INFLIGHT:
            for transport in order:
                runs.setdefault((transport, inflight), []).append(
                    measure(transport, inflight, args.seconds)
                )
    table = [median_row(runs[(t, n)]) for n in INFLIGHT for t in TRANSPORTS]
    report(table)
    if not args.quick:
        every = [row for rows in runs.values() for row in rows]
        write_results(RESULTS, args=vars(args), rows=table, runs=every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
