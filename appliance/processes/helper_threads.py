"""Helper threads under SCHED_BATCH: woken, they never preempt the thread doing a request's work.

PERF: a request crosses several threads that only carry it: ZeroMQ's I/O
thread in each process (each send hands the message to it, and each message
that arrives wakes the receiving thread through it) and, in a gRPC frontend,
grpcio's event engine and completion-queue poller. Woken, each of them
preempted the thread that woke it: a frontend's event loop or a model worker
was put off its CPU in the middle of its turn and switched back in
afterwards. Linux never lets a woken SCHED_BATCH thread preempt the running
one (it takes an idle CPU, or waits until the running thread sleeps or uses
up its slice), so with the helpers under SCHED_BATCH the thread doing the
work finishes its turn first: a frontend hands over more requests at once,
its worker takes more per wake-up, and the turn is not cut in two. The
threads doing the work (event loops, model workers) keep the default
policy.

The price: a woken SCHED_BATCH thread waits while other threads keep every
CPU busy (it preempts nobody), so on a host whose CPUs other work saturates,
each of a request's hand-offs waits for a slice to end and latency rises
several-fold. Hence ``server.helper_threads_batch`` is off by default, for
hosts kept for the appliance. docs/performance.md, "Helper threads under
SCHED_BATCH", has both measurements.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

import zmq

_SCHED_POLICY = int(zmq.THREAD_SCHED_POLICY)


def zmq_context(batch: bool) -> zmq.Context[Any]:
    """A ZeroMQ context whose I/O thread runs under SCHED_BATCH when ``batch`` and
    the kernel allows it (elsewhere under the default policy)."""
    context: zmq.Context[Any] = zmq.Context()
    if batch and batch_allowed():
        context.set(_SCHED_POLICY, os.SCHED_BATCH)
    return context


@contextlib.contextmanager
def started_batch(batch: bool) -> Iterator[None]:
    """The threads started inside (a library's pool) run under SCHED_BATCH when
    ``batch``: they inherit it from this thread, whose own policy comes back after."""
    if not (batch and batch_allowed()):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


@functools.cache
def batch_allowed() -> bool:
    """Whether a thread of this process may take SCHED_BATCH.

    SAFETY: libzmq sets the policy in its I/O thread and aborts the process
    when the kernel refuses (a seccomp filter, a platform without it); a
    thread of our own tries first, and only its own policy changes.
    """
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    allowed: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, policy, os.sched_param(0))
        except OSError:
            allowed.append(False)
        else:
            allowed.append(True)

    thread = threading.Thread(target=probe, name="sched-probe", daemon=True)
    thread.start()
    thread.join()
    return allowed == [True]
