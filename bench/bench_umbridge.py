"""UM-Bridge Evaluate round trips: the appliance vs UM-Bridge's own Python server.

Both serve UM-Bridge's test model ``forward`` (y = 2x, one input and one
output of size 1; PROTOCOL-FACTS §5.4) on loopback, in the same run:

- appliance: ``forward`` behind the HTTP frontend, as the default config
  ships it (2 gunicorn workers x 8 threads), through the model worker;
- reference: ``umbridge.serve_models`` (aiohttp, PyPI 1.2.10) in its own
  process, with the same model written as a plain ``umbridge.Model``.

Clients, each with 1 and 4 threads in flight:

- session: raw ``POST /Evaluate`` over a keep-alive ``requests.Session``
  (the server's cost, without connection setup);
- client: ``umbridge.HTTPModel(...)([[x]])`` as users call it (requests
  opens a new connection per call);
- shmem: the same with ``use_shmem=True`` (vectors through /dev/shm).

Each measurement is repeated; the table shows medians over repeats and the
appliance/reference ratio of those medians; bench/results/umbridge.json holds
every repeat. Usage::

    python bench/bench_umbridge.py [--repeats N] [--count N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests
import umbridge

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loadgen import thread_loop, write_results  # noqa: E402
from tests.system.harness import demo_models, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "umbridge.json"
CLIENTS = ("session", "client", "shmem")
INFLIGHT = (1, 4)
QUIET = threading.Lock()  # redirect_stdout is process-wide

REFERENCE_SERVER = """
import sys, umbridge

class Forward(umbridge.Model):
    def __init__(self):
        super().__init__("forward")
    def get_input_sizes(self, config):
        return [1]
    def get_output_sizes(self, config):
        return [1]
    def __call__(self, parameters, config):
        return [[2.0 * parameters[0][0]]]
    def supports_evaluate(self):
        return True

umbridge.serve_models([Forward()], int(sys.argv[1]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def reference_server() -> Iterator[str]:
    """Run umbridge.serve_models in a child process; stop it by PID."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", REFERENCE_SERVER, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(requests.ConnectionError):
                requests.get(f"{url}/Info", timeout=2)
                break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("the reference UM-Bridge server did not start")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def caller(url: str, kind: str) -> Callable[[float], list[list[float]]]:
    """Return a per-thread Evaluate function for one client kind."""
    if kind == "session":
        session = requests.Session()

        def post(x: float) -> list[list[float]]:
            body = json.dumps({"name": "forward", "input": [[x]], "config": {}})
            return list(session.post(f"{url}/Evaluate", data=body, timeout=30).json()["output"])

        return post
    # The client prints whether shared memory works; keep the table readable.
    with QUIET, contextlib.redirect_stdout(io.StringIO()):
        model = umbridge.HTTPModel(url, "forward", use_shmem=kind == "shmem")
    return lambda x: list(model([[x]]))


def closed_loop(url: str, kind: str, count: int, inflight: int) -> dict[str, float]:
    """Run ``count`` Evaluate calls from ``inflight`` threads, after a tenth to warm up."""

    def make_call(index: int) -> Callable[[], None]:
        evaluate = caller(url, kind)
        numbers = itertools.count(index * 100000)

        def call() -> None:
            x = float(next(numbers))
            reply = evaluate(x)
            if reply != [[2.0 * x]]:
                raise AssertionError(f"forward({x}) returned {reply}")

        return call

    return thread_loop(make_call, count, inflight, warmup=max(1, count // 10 // inflight))


def measure(urls: dict[str, str], count: int) -> dict[str, Any]:
    """One repeat: every server x client kind x in-flight count."""
    run: dict[str, Any] = {}
    for kind in CLIENTS:
        for inflight in INFLIGHT:
            for server, url in urls.items():
                run[f"{server}/{kind}/{inflight}"] = closed_loop(url, kind, count, inflight)
    return run


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for kind in CLIENTS:
        for inflight in INFLIGHT:
            row: dict[str, float] = {}
            for server in ("appliance", "reference"):
                key = f"{server}/{kind}/{inflight}"
                for metric in ("p50_us", "rps"):
                    row[f"{server}_{metric}"] = statistics.median(r[key][metric] for r in runs)
            row["p50_ratio"] = row["appliance_p50_us"] / row["reference_p50_us"]
            row["rps_ratio"] = row["appliance_rps"] / row["reference_rps"]
            summary[f"{kind}/{inflight}"] = row
    return summary


def print_table(summary: dict[str, Any]) -> None:
    print(
        f"{'client/in flight':<18}{'appl p50 us':>12}{'ref p50 us':>12}{'ratio':>7}"
        f"{'appl rps':>10}{'ref rps':>10}{'ratio':>7}"
    )
    for name, row in summary.items():
        print(
            f"{name:<18}{row['appliance_p50_us']:>12.0f}{row['reference_p50_us']:>12.0f}"
            f"{row['p50_ratio']:>7.2f}{row['appliance_rps']:>10.0f}{row['reference_rps']:>10.0f}"
            f"{row['rps_ratio']:>7.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--count", type=int, default=400, help="calls per measurement")
    parser.add_argument("--quick", action="store_true", help="few calls, for a smoke run")
    args = parser.parse_args()
    count = 40 if args.quick else args.count
    runs = []
    http = {"workers": 2, "threads": 8}
    with running(demo_models("forward"), http=http) as appliance, reference_server() as ref:
        urls = {"appliance": f"http://127.0.0.1:{appliance.ports['http']}", "reference": ref}
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
            runs.append(measure(urls, count))
    summary = summarize(runs)
    print_table(summary)
    write_results(
        RESULTS,
        bench="umbridge",
        model="forward",
        count=count,
        repeats=args.repeats,
        summary=summary,
        runs=runs,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
