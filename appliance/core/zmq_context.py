"""A process's ZeroMQ context, its I/O thread woken without preempting the thread that woke it.

PERF: each send on a ZeroMQ socket hands the message to the context's I/O
thread, and each message that arrives wakes the receiving thread through
it. Woken, the I/O thread preempted the thread that woke it: a frontend's
event loop, or a model worker, was put off its CPU in the middle of its
turn, and switched back in afterwards. Linux never lets a woken SCHED_BATCH
thread preempt the running one (it takes an idle CPU, or waits for the
running thread to yield or use up its slice), so with the I/O thread under
SCHED_BATCH the sender finishes its turn first: a frontend hands over more
requests at once and its worker takes more per wake-up. On 2 vCPUs
(docs/performance.md, "ZeroMQ's I/O threads under SCHED_BATCH") that cut a
KServe REST request's CPU by a tenth at 8 clients, the model worker's by a
fifth, and the wake-ups of the whole tree per request from 3.9 to 3.0.
``server.zmq_io_batch = false`` keeps the default policy.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import zmq

_SCHED_POLICY = int(zmq.THREAD_SCHED_POLICY)


def new_context(io_batch: bool) -> zmq.Context[Any]:
    """A ZeroMQ context whose I/O thread runs under SCHED_BATCH when ``io_batch``
    and the kernel allows it (elsewhere the default policy, silently)."""
    context: zmq.Context[Any] = zmq.Context()
    if io_batch and batch_allowed():
        context.set(_SCHED_POLICY, os.SCHED_BATCH)
    return context


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
