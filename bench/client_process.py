"""The client-process side of :class:`bench.loadgen.ClientPool`.

A client process serves the pool's commands over a pipe: ``prepare`` (build
the calls for a target and make one request on each), ``run`` (closed or
paced loops until a shared wall-clock end), ``release`` (close the calls) and
``None`` (exit). A process with several loops runs them on long-lived lanes.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import queue
import threading
import time
from array import array
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import orjson

# A call sends one request and checks its reply; it may have a close().
Call = Callable[[], object]
# make_call(spec, shared) -> Call; ``shared`` is a dict private to the process
# for objects its calls share (a connection to reuse); values with a close()
# are closed when the process ends.
MakeCall = Callable[[Any, dict[str, Any]], Call]

MAX_ERRORS = 20  # per loop and measurement; then the loop stops early
# A loop goes on past the end until it has one measured request, this long at most.
OVERRUN_S = 30.0


class _Lanes:
    """Long-lived threads of a client process; lane 0 is the main thread.

    Lane t always runs on the same thread, so what a call built there stays
    with it (gevent-based clients such as tritonclient.http bind a
    connection to the thread that made it).
    """

    def __init__(self) -> None:
        self.inboxes: list[queue.SimpleQueue[Any]] = []

    def run(self, count: int, job: Callable[[int], Any]) -> list[Any]:
        """Run ``job(t)`` on lanes 0..count-1 at once; return the results in order."""
        while len(self.inboxes) < count - 1:
            inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
            threading.Thread(target=_lane, args=(inbox,), daemon=True).start()
            self.inboxes.append(inbox)
        outbox: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        for lane in range(1, count):
            self.inboxes[lane - 1].put((job, lane, outbox))
        results = {0: _guarded(job, 0)}
        for _ in range(count - 1):
            lane, result = outbox.get()
            results[lane] = result
        return [results[lane] for lane in range(count)]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)


def _lane(inbox: queue.SimpleQueue[Any]) -> None:
    while (work := inbox.get()) is not None:
        job, lane, outbox = work
        outbox.put((lane, _guarded(job, lane)))


def _guarded(job: Callable[[int], Any], lane: int) -> Any:
    try:
        return job(lane)
    except Exception as error:
        return error


class _Client:
    """One client process's calls, by target and lane."""

    def __init__(self, make_call: MakeCall) -> None:
        self.make_call = make_call
        self.shared: dict[str, Any] = {}
        self.calls: dict[tuple[bytes, int], Call] = {}
        self.lanes = _Lanes()
        self.used = 1

    def call_for(self, spec: Any, lane: int) -> Call:
        key = (orjson.dumps(spec, option=orjson.OPT_SORT_KEYS), lane)
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = self.make_call(spec, self.shared)
        return call

    def drop(self, spec: Any, lane: int) -> None:
        key = (orjson.dumps(spec, option=orjson.OPT_SORT_KEYS), lane)
        _close(self.calls.pop(key, None))

    def prepare(self, spec: Any, lanes: int) -> str | None:
        """Build missing calls and make one request on each; return an error or None.

        The first request on a new connection pays for its setup, which no
        measurement should; calls kept from an earlier measurement are warm.
        """
        self.used = max(self.used, lanes)

        def first(lane: int) -> str | None:
            key = (orjson.dumps(spec, option=orjson.OPT_SORT_KEYS), lane)
            if key in self.calls:
                return None
            try:
                self.call_for(spec, lane)()
            except Exception as error:
                self.drop(spec, lane)
                return _describe(error)
            return None

        return next((e for e in self.lanes.run(lanes, first) if e), None)

    def run(
        self,
        spec: Any,
        lanes: int,
        start_at: float,
        stop_at: float,
        interval: float,
        slot: int,
        concurrency: int,
    ) -> dict[str, Any]:
        """Run a loop on each lane; paced loops are spread evenly over the interval."""

        def loop(lane: int) -> tuple[array[float], int, list[str], float]:
            offset = (slot + lane) / concurrency * interval
            return _loop(self, spec, lane, start_at, stop_at, interval, offset)

        cpu_before = time.process_time()
        results = self.lanes.run(lanes, loop)
        latencies: array[float] = array("d")
        errors, messages, last_end = 0, [], 0.0
        for result in results:
            if isinstance(result, Exception):
                errors, messages = errors + 1, [*messages, _describe(result)]
                continue
            latencies.extend(result[0])
            errors += result[1]
            messages += result[2]
            last_end = max(last_end, result[3])
        return {
            "latencies": latencies.tobytes(),
            "errors": errors,
            "messages": messages[:3],
            "cpu_s": time.process_time() - cpu_before,
            "last_end": last_end,
        }

    def release(self) -> None:
        """Close every call on the lane that made it."""

        def close_mine(lane: int) -> None:
            for key in [key for key in self.calls if key[1] == lane]:
                _close(self.calls.pop(key))

        self.lanes.run(self.used, close_mine)

    def close(self) -> None:
        self.release()
        self.lanes.close()
        for value in self.shared.values():
            _close(value)
        self.shared.clear()


def client_main(conn: Connection, make_call: MakeCall, preload: tuple[str, ...]) -> None:
    """Serve commands from the pool until told to stop."""
    for module in preload:
        importlib.import_module(module)
    client = _Client(make_call)
    conn.send("ready")
    try:
        while (command := conn.recv()) is not None:
            if command[0] == "prepare":
                conn.send(client.prepare(command[1], command[2]))
            elif command[0] == "run":
                conn.send(client.run(*command[1:]))
            else:
                client.release()
                conn.send("released")
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        client.close()


def _loop(
    client: _Client,
    spec: Any,
    lane: int,
    start_at: float,
    stop_at: float,
    interval: float,
    offset: float,
) -> tuple[array[float], int, list[str], float]:
    """One closed (interval 0) or paced loop: latencies, errors, messages, last end.

    Wall-clock ``start_at``/``stop_at`` are shared by every process; latencies
    are taken with perf_counter. A paced loop warms up on the same schedule.
    A request counts if it starts in the window; a loop with none by
    ``stop_at`` (a slow cell) goes on for one, up to OVERRUN_S.
    """
    latencies: array[float] = array("d")
    errors, messages = 0, []
    skew = time.time() - time.perf_counter()
    scheduled = time.perf_counter()
    last_end = 0.0
    if interval:
        first = start_at - skew + offset
        scheduled = first - math.floor((first - scheduled) / interval) * interval
    while errors < MAX_ERRORS:
        now = time.perf_counter()
        if not interval:
            scheduled = now
        moment = max(now, scheduled) + skew
        if moment >= stop_at and (latencies or moment >= stop_at + OVERRUN_S):
            break
        if scheduled > now:
            time.sleep(scheduled - now)
        measuring = scheduled + skew >= start_at
        try:
            client.call_for(spec, lane)()
        except Exception as error:
            errors += measuring
            messages.append(_describe(error))
            client.drop(spec, lane)
            time.sleep(0.01)
        else:
            if measuring:
                ended = time.perf_counter()
                latencies.append(ended - scheduled)
                last_end = ended + skew
        scheduled += interval
    return latencies, errors, messages[:3], last_end


def _close(value: object) -> None:
    close = getattr(value, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]
