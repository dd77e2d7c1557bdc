"""kill -9 of every kind of frontend, twenty times each, under load.

Every frontend port is a listening socket that the master owns and passes to
the processes serving it (appliance/config/listeners.py): a process that dies takes
no connection queued for the port with it, and while it is replaced new
connections wait in the port's queue. So a prober that opens new
connections to every port in a tight loop throughout, and holds each for a
moment, sees none refused and none reset. HTTP runs one worker, so each of
its kills leaves the port with no process at all until gunicorn forks the
next; gRPC and MIP run four, and each kill takes the one whose slot was
killed longest ago (a slot killed again soon restarts after a backoff).

One killer thread per transport SIGKILLs ready processes of its kind, twenty
in all: HTTP's worker each time once its replacement serves; gRPC's and
MIP's with up to two awaiting their replacement by the master, so that two
of four always serve. Meanwhile several threads per protocol call ``faulty``
(y = 2x) with stock clients that reconnect after an error: a call may fail
only while a process of its own transport was being killed and replaced,
at most one call per client thread and kill (the one in flight on the
process's connection), and none hang. The counts are printed.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import pytest

from tests.system import traffic
from tests.system.harness import Appliance, eventually, running

KILLS = 20
THREADS = 3
PACE_S = 0.02
WAIT_S = 30.0
# A client may find its connection to a killed process dead only at its next
# call, a pace (and a busy host's scheduling delay) after the kill.
NOTICE_S = 2.0
PROCESSES = 4
# Kills of a transport awaiting their replacement at once: half the gRPC and
# MIP processes keep serving; HTTP's one worker is killed again only once its
# replacement serves.
AT_ONCE = {"http": 1, "grpc": PROCESSES // 2, "mip": PROCESSES // 2}
# Which protocols ride each transport's port, and the process to kill there.
VICTIMS = {
    "http": ("http worker", (traffic.KserveRest, traffic.UmBridge)),
    "grpc": ("grpc", (traffic.KserveGrpc,)),
    "mip": ("mip", (traffic.Mip,)),
}
# How long the prober keeps each connection open before it looks for a reset,
# and the pause between its rounds (one new connection per port each).
HOLD_S = 0.3
PROBE_PAUSE_S = 0.002


class Prober(threading.Thread):
    """Open new connections to every port in a tight loop; count refusals and resets.

    A connection the kernel had queued on a listening socket that goes away
    is reset, and the reset may come after connect() returned: so each
    connection is held for HOLD_S, then read without blocking. The prober
    sends nothing, so a connection that a process had accepted and then
    died with is closed with a FIN (no unread bytes), not reset: a reset
    means a connection lost before any process took it.
    """

    def __init__(self, ports: dict[str, int]) -> None:
        super().__init__(name="prober", daemon=True)
        self.ports = ports
        self.opened = dict.fromkeys(ports, 0)
        self.failed: list[tuple[str, str]] = []
        self._held: deque[tuple[float, str, socket.socket]] = deque()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(PROBE_PAUSE_S):
            for name, port in self.ports.items():
                self._open(name, port)
            self._look(time.monotonic() - HOLD_S)
        self._look(math.inf)

    def _open(self, name: str, port: int) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2.0)
        except OSError as ex:
            self.failed.append((name, f"connect: {ex!r}"))
            return
        self.opened[name] += 1
        sock.setblocking(False)
        self._held.append((time.monotonic(), name, sock))

    def _look(self, opened_before: float) -> None:
        while self._held and self._held[0][0] <= opened_before:
            _opened, name, sock = self._held.popleft()
            try:
                sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                pass  # open, nothing sent yet
            except OSError as ex:
                self.failed.append((name, f"held: {ex!r}"))
            finally:
                sock.close()

    def counts(self) -> dict[str, dict[str, int]]:
        """Per port: connections opened, refused, reset (and any other failure)."""
        result = {}
        for name in self.ports:
            mine = [what for port, what in self.failed if port == name]
            refused = sum("ConnectionRefused" in what for what in mine)
            reset = sum("ConnectionReset" in what for what in mine)
            result[name] = {
                "opened": self.opened[name],
                "refused": refused,
                "reset": reset,
                "other": len(mine) - refused - reset,
            }
        return result

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10.0)


@dataclass(frozen=True, slots=True)
class Kill:
    """One SIGKILL: the transport, the victim, when, and when a replacement served."""

    transport: str
    title: str
    pid: int
    at: float
    back: float


class Killer(threading.Thread):
    """SIGKILL ready processes of one role KILLS times, ``at_once`` at most awaiting replacement."""

    def __init__(self, served: Appliance, transport: str, role: str, at_once: int) -> None:
        super().__init__(name=f"killer-{transport}", daemon=True)
        self.served = served
        self.transport = transport
        self.role = role
        self.at_once = at_once
        self.kills: list[Kill] = []
        self.error = ""
        self._pending: list[tuple[str, int, float]] = []  # title, pid, when killed
        self._last_killed: dict[str, float] = {}

    def run(self) -> None:
        try:
            while len(self.kills) < KILLS:
                ready = live(self.served, self.role)
                self._note_replaced(ready)
                if len(self.kills) + len(self._pending) < KILLS:
                    self._maybe_kill(ready)
                time.sleep(0.05)
        except Exception as ex:
            self.error = f"{self.transport}: {traffic.describe(ex)}"

    def _maybe_kill(self, ready: dict[str, int]) -> None:
        if len(self._pending) >= self.at_once:
            return
        doomed = {pid for _title, pid, _at in self._pending}
        candidates = {title: pid for title, pid in ready.items() if pid not in doomed}
        if not candidates:
            return
        # The slot killed longest ago: a slot's restart backs off only while
        # its process keeps dying young.
        title = min(candidates, key=lambda t: self._last_killed.get(t, 0.0))
        at = time.monotonic()
        os.kill(candidates[title], signal.SIGKILL)
        self._last_killed[title] = at
        self._pending.append((title, candidates[title], at))

    def _note_replaced(self, ready: dict[str, int]) -> None:
        now = time.monotonic()
        for title, pid, at in list(self._pending):
            if self._replaced(title, pid, ready):
                self._pending.remove((title, pid, at))
                self.kills.append(Kill(self.transport, title, pid, at, now))
            else:
                assert now - at < WAIT_S, f"{title} not replaced: {self.served.processes()}"

    def _replaced(self, title: str, victim: int, ready: dict[str, int]) -> bool:
        if self.transport != "http":
            return ready.get(title) not in (None, victim)
        # gunicorn lists a worker as soon as it forks it; with one worker,
        # an answered request shows the new one serves.
        others = set(ready.values()) - {victim}
        return bool(others) and _http_answers(self.served.ports["http"])


def live(served: Appliance, role: str) -> dict[str, int]:
    """Title -> pid of the live, ready processes of a role ("grpc": grpc[0], ...)."""
    found = {}
    for row in served.processes():
        pid = int(row["pid"] or 0)
        if row["role"].split("[")[0] == role and pid and row["state"] == "ready" and _alive(pid):
            title = row["role"] if role != "http worker" else f"http worker {pid}"
            found[title] = pid
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _http_answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 2.0) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.recv(12).startswith(b"HTTP/1.1 200")
    return False


def counts(calls: list[traffic.Call]) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    for call in calls:
        entry = found.setdefault(call.protocol, {"answered": 0, "failed": 0})
        entry["failed" if call.error else "answered"] += 1
    return found


def unexplained(loops: list[traffic.Loop], kills: list[Kill]) -> list[str]:
    """Failed calls that no kill of their own transport explains, or more than kills explain.

    A kill explains a failed call of its transport that ended after the kill
    and started before its replacement served (or soon after: a client finds
    its connection dead only when it next uses it), at most THREADS calls of
    each protocol (one per client thread). Up to AT_ONCE kills of a transport
    await their replacements at once, so a failed call may lie in the windows
    of two: calls are taken in the order they ended, each charged to the kill
    whose window closes first and that has room left, so that the calls of a
    first kill are not charged to the second.
    """
    transport_of = {k.protocol: t for t, (_role, kinds) in VICTIMS.items() for k in kinds}
    problems = []
    charged: dict[tuple[Kill, str], int] = {}
    failed = sorted((c for loop in loops for c in loop.calls if c.error), key=lambda c: c.ended)
    for call in failed:
        transport = transport_of[call.protocol]
        explaining = sorted(
            (
                k
                for k in kills
                if k.transport == transport
                and k.at <= call.ended
                and call.started <= k.back + NOTICE_S
            ),
            key=lambda k: k.back,
        )
        if not explaining:
            problems.append(f"{call.protocol} failed with no {transport} kill: {call.error}")
            continue
        room = [k for k in explaining if charged.get((k, call.protocol), 0) < THREADS]
        if not room:
            victims = ", ".join(k.title for k in explaining)
            problems.append(
                f"more than {THREADS} {call.protocol} calls failed for each kill of {victims}"
            )
            continue
        charged[room[0], call.protocol] = charged.get((room[0], call.protocol), 0) + 1
    return problems


@pytest.fixture
def served() -> Any:
    model = {"name": "faulty", "class": "tests.system.faulty:Faulty", "instances": 2}
    with running(
        [model],
        server={"stop_timeout_s": 3.0},
        http={"workers": 1},
        grpc={"workers": PROCESSES},
        mip={"workers": PROCESSES, "listeners": [{"port": 0, "model": "faulty"}]},
    ) as appliance:
        yield appliance


# Close to a minute of load (sixty kills): in make test-long, so make test stays under 15 minutes.
@pytest.mark.long
def test_killing_frontends_resets_and_refuses_no_connection_and_fails_only_their_calls(
    served: Appliance,
) -> None:
    ports = served.ports
    ep = traffic.Endpoints(ports["http"], ports["grpc"], ports["mip"], "faulty")
    callers = [c for _, kinds in VICTIMS.values() for c in kinds]
    loops = traffic.start_loops(ep, PACE_S, callers * THREADS)
    prober = Prober({name: ports[name] for name in VICTIMS})
    killers = [
        Killer(served, transport, role, AT_ONCE[transport])
        for transport, (role, _) in VICTIMS.items()
    ]
    started = time.monotonic()
    try:
        assert eventually(lambda: traffic.all_succeeded_since(loops, 0.0), WAIT_S)
        prober.start()
        for killer in killers:
            killer.start()
        for killer in killers:
            killer.join(KILLS * WAIT_S)
        back = time.monotonic()
        assert eventually(lambda: traffic.all_succeeded_since(loops, back), WAIT_S)
    finally:
        prober.stop()
        hung = traffic.stop_loops(loops)
        kills = [kill for killer in killers for kill in killer.kills]
        everything = counts([c for loop in loops for c in loop.calls])
        print(f"\n{len(kills)} kills in {time.monotonic() - started:.1f} s")
        for killer in killers:
            took = [k.back - k.at for k in killer.kills]
            print(
                f"{killer.transport}: {len(took)} kills, replaced in "
                f"{min(took, default=0):.2f}-{max(took, default=0):.2f} s {killer.error}"
            )
        for protocol, entry in sorted(everything.items()):
            stuck = sum(1 for loop in loops if loop.protocol == protocol and loop.is_alive())
            print(
                f"{protocol}: answered {entry['answered']}, failed {entry['failed']}, hung {stuck}"
            )
        print(f"new connections per port: {prober.counts()}")
    assert not [k.error for k in killers if k.error or k.is_alive()], [k.error for k in killers]
    assert all(len(killer.kills) == KILLS for killer in killers)
    assert not hung, f"calls still running at the end: {hung}"
    assert not prober.failed, f"new connections refused or reset: {prober.failed[:5]}"
    assert all(prober.opened.values()), prober.opened
    problems = unexplained(loops, kills)
    assert not problems, problems[:10]
