"""The model worker's CPU per request at paced rates, for two appliance trees.

bench/ab.py drives closed loops: each client sends its next request as soon
as the last is answered, so a worker is never idle for long. A change that
moves work to when the worker goes idle (worker/own_slot.py) can cost a
wake-up a request where requests come further apart; this measures that.
One KServe REST JSON client (http.client, one kept-alive connection) sends
16 B identity requests at each rate, the two trees alternating in rounds;
the figure is the model worker process's run time (every thread, from
/proc/PID/task/TID/schedstat) per request, medians over rounds.
Not run by ``make bench``. Usage::

    python bench/worker_paced.py --a-dir /tmp/base --name histograms
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from http.client import HTTPConnection
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import threads  # noqa: E402
from tests.system.harness import running  # noqa: E402

BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)
WARMUP = 200


def measure(tree: Path, rate: float, seconds: float) -> float:
    """CPU µs per request of the model worker serving ``rate`` requests a second."""
    models = [{"name": "identity", "class": "appliance.demos.identity:Identity"}]
    env = {"PYTHONPATH": str(tree)}
    with running(models, env=env, cwd=tree, server={"access_log": False}) as app:
        processes = psutil.Process(app.process.pid).children(recursive=True)
        conn = HTTPConnection("127.0.0.1", app.ports["http"], timeout=10)
        headers = {"Content-Type": "application/json"}

        def one() -> None:
            conn.request("POST", "/v2/models/identity/infer", BODY, headers)
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status

        for _ in range(WARMUP):
            one()
        time.sleep(0.5)
        count = int(rate * seconds)
        before, started = threads.snapshot(processes), time.monotonic()
        for index in range(count):
            one()
            pause = started + (index + 1) / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        time.sleep(0.3)  # what the last request leaves to do once idle
        by_role = threads.per_request(before, threads.snapshot(processes), count, threads.by_role)
        conn.close()
        return by_role["model worker"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="results go to bench/results/paced-NAME.*")
    parser.add_argument("--a-dir", type=Path, required=True, help="A: the tree to compare with")
    parser.add_argument("--b-dir", type=Path, default=ROOT, help="B: this tree by default")
    parser.add_argument("--rates", default="100,400", help="requests a second, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    sides = {"A": args.a_dir.resolve(), "B": args.b_dir.resolve()}
    figures: dict[str, dict[float, list[float]]] = {side: {r: [] for r in rates} for side in sides}
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for side in order:
            for rate in rates:
                figures[side][rate].append(measure(sides[side], rate, args.seconds))
        print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
    lines = [
        f"A: {sides['A']}; B: {sides['B']}. The model worker process's CPU µs per request "
        f"at one paced KServe REST JSON client, medians of {args.repeats} rounds (range).",
        "",
        "| requests a second | A | B | B / A |",
        "|---|---|---|---|",
    ]
    for rate in rates:
        a, b = figures["A"][rate], figures["B"][rate]
        lines.append(
            f"| {rate:,.0f} | {statistics.median(a):,.0f} ({min(a):,.0f}-{max(a):,.0f}) "
            f"| {statistics.median(b):,.0f} ({min(b):,.0f}-{max(b):,.0f}) "
            f"| {statistics.median(b) / statistics.median(a):.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    results = ROOT / "bench" / "results"
    (results / f"paced-{args.name}.md").write_text(text)
    raw = {
        side: {str(rate): values for rate, values in by_rate.items()}
        for side, by_rate in figures.items()
    }
    (results / f"paced-{args.name}.json").write_text(
        json.dumps(
            {"sides": {k: str(v) for k, v in sides.items()}, "us_per_request": raw}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
