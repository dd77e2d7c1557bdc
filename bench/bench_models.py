"""Many models on one host: how fast they start, what each costs idle, a cold call's latency.

Points: 1, 10, 50 and 200 copies of the ``simple`` demo model, and a mixed
set (20 ``simple``, 4 ONNX and 4 TorchScript digits from a model repository),
one instance each, one frontend process per protocol. Each point runs, in
one run, as:

- ``before``: model workers started with a fresh exec and a 32 MiB response
  ring each (the appliance before issue 39);
- ``exec``: a fresh exec, response rings sized to the model
  (``server.model_start = "exec"``): what the rings alone change;
- ``zygote``: forked from the zygote, rings sized to the model (the default);
- ``mlserver``: MLServer 1.7.1 serving the same models in one process
  (``parallel_workers`` 0; runtimes in bench/peers/mlserver_many.py).

Per run: the time from start to ready (every model ready); memory once idle:
each model worker's USS and PSS (psutil's terms, from /proc/<pid>/smaps_rollup)
and the whole tree's, counted once: the PSS of every process less its shared
memory pages, plus the tree's files in /dev/shm (the rings, whoever maps
them); and the latency of the first KServe REST request to each of a few
models never called before (cold), against the same request once warm.

The host is shared: each run waits until the 1-minute load average is below
QUIET_LOAD (up to QUIET_WAIT_S, then runs and records the load it had),
rounds alternate the order of the variants, and the table gives medians over
rounds. A run that would need more memory than the host has free is skipped
and says so. Usage::

    python bench/bench_models.py [--quick] [--rounds R] [--points 1,10,50,200,mixed]
                                 [--variants before,exec,zygote,mlserver]

Results: bench/results/models.json (models-quick.json with --quick) and the
table in bench/results/models.md; a full run also writes it into
docs/performance.md, between the ``bench-models`` markers ("Many models").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import servers  # noqa: E402
from bench.doc_tables import PAGE, update  # noqa: E402
from bench.loadgen import write_results  # noqa: E402
from bench.model_calls import LARGE, large_config, latencies  # noqa: E402
from bench.model_folders import (  # noqa: E402
    appliance_config,
    mlserver_folders,
    point_models,
    repository,
)
from bench.model_tables import large_table, summarize, table, touch_table  # noqa: E402
from bench.tree_memory import tree_memory  # noqa: E402
from tests.system.harness import Appliance, start  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MiB = 1 << 20
QUIET_LOAD = 1.5
QUIET_WAIT_S = 600.0
# After ready, before memory is read: the last workers finish their start.
IDLE_S = 3.0
READY_TIMEOUT_S = 900.0
VARIANTS = ("before", "exec", "zygote", "mlserver")
POINTS = ("1", "10", "50", "200", "mixed")
# Rough MiB per model and fixed MiB, to skip a run the host has no room for.
NEED_MIB = {"before": (70, 600), "exec": (35, 600), "zygote": (12, 600), "mlserver": (6, 400)}
HEADROOM_MIB = 3072


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def quiet(wait_s: float) -> float:
    """Wait until the host's 1-minute load is below QUIET_LOAD (at most ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(5.0)
    return round(os.getloadavg()[0], 2)


# -- the appliance ---------------------------------------------------------------


@contextlib.contextmanager
def appliance_run(config: dict[str, Any]) -> Iterator[tuple[Appliance, float]]:
    began = time.monotonic()
    appliance = start(config, wait=False)
    try:
        appliance.wait_ready(READY_TIMEOUT_S)
        ready_s = time.monotonic() - began
        if not appliance.state.get("ready"):
            raise RuntimeError(f"settled but not ready:\n{appliance.log()[-2000:]}")
        yield appliance, ready_s
    finally:
        try:
            appliance.stop()
            appliance.assert_clean()
        finally:
            shutil.rmtree(appliance.run_dir, ignore_errors=True)


def measure_appliance(variant: str, models: list[tuple[str, str]], repo: Path) -> dict[str, Any]:
    with appliance_run(appliance_config(variant, models, repo)) as (appliance, ready_s):
        time.sleep(IDLE_S)
        rows = appliance.processes()
        workers = {int(row["pid"]) for row in rows if row["model"] and row["pid"]}
        forked = appliance.log().count("forked model[")
        memory = tree_memory(appliance.process.pid, f"appliance-{appliance.tree}-", workers)
        base = f"http://127.0.0.1:{appliance.ports['http']}"
        calls = latencies(base, models)
        large = large_config(appliance, base, models) if len(models) >= LARGE else {}
    return {"ready_s": ready_s, "forked": forked, **memory, **calls, **large}


# -- MLServer --------------------------------------------------------------------


@contextlib.contextmanager
def mlserver_run(models: list[tuple[str, str]], repo: Path) -> Iterator[tuple[Any, float]]:
    bin_dir = servers.ensure_venv("mlserver", servers.MLSERVER)
    ports = {name: servers.free_port() for name in ("http", "grpc", "metrics")}
    settings = {
        "debug": False,
        "parallel_workers": 0,
        "host": "127.0.0.1",
        "http_port": ports["http"],
        "grpc_port": ports["grpc"],
        "metrics_port": ports["metrics"],
    }
    with tempfile.TemporaryDirectory(prefix="bench-mlserver-many-") as home:
        Path(home, "settings.json").write_text(json.dumps(settings))
        mlserver_folders(models, repo, Path(home))
        base = f"http://127.0.0.1:{ports['http']}"

        def ready() -> bool:
            index = requests.post(f"{base}/v2/repository/index", json={}, timeout=5).json()
            return sum(1 for model in index if model.get("state") == "READY") == len(models)

        env = {
            "PYTHONPATH": str(servers.PEER_CODE),
            "BENCH_APPLIANCE_SITE": sysconfig.get_paths()["purelib"],
        }
        argv = [str(bin_dir / "mlserver"), "start", home]
        urls = {"rest": f"127.0.0.1:{ports['http']}"}
        began = time.monotonic()
        with servers.started("mlserver-many", argv, urls, ready, Path(home), env) as server:
            yield server, time.monotonic() - began


def measure_mlserver(models: list[tuple[str, str]], repo: Path) -> dict[str, Any]:
    with mlserver_run(models, repo) as (server, ready_s):
        time.sleep(IDLE_S)
        memory = tree_memory(server.process.pid, None, set())
        # In one process, the whole server is what the models cost.
        memory["worker_uss_mib"] = memory["worker_pss_mib"] = None
        calls = latencies(f"http://{server.urls['rest']}", models)
    return {"ready_s": ready_s, **memory, **calls}


# -- a ring's first touch ----------------------------------------------------------


def ring_touch(repeats: int = 15) -> list[dict[str, Any]]:
    """What pre-faulting a response ring costs where: the worker making it, or the
    frontend's first reply (its attach reads every page, allocating any not yet there)."""
    from appliance.core.segment import Segment

    rows = []
    for size in (MiB, 32 * MiB):
        for prefault in (True, False):
            made, attached = [], []
            for index in range(repeats):
                name = f"appliance-benchmodels{os.getpid()}-x{index}"
                began = time.perf_counter()
                owner = Segment.create(name, size, prefault=prefault)
                made.append(time.perf_counter() - began)
                began = time.perf_counter()
                reader = Segment.attach(name)
                attached.append(time.perf_counter() - began)
                reader.close()
                owner.close()
                owner.unlink()
            rows.append(
                {
                    "ring_mib": size // MiB,
                    "prefault": prefault,
                    "create_ms": statistics.median(made) * 1e3,
                    "first_attach_ms": statistics.median(attached) * 1e3,
                }
            )
    return rows


# -- the run ---------------------------------------------------------------------


def room_for(variant: str, count: int) -> tuple[bool, str]:
    per, fixed = NEED_MIB[variant]
    need = per * count + fixed
    free = psutil.virtual_memory().available / MiB
    if free - need < HEADROOM_MIB:
        return False, f"needs about {need} MiB; {free:.0f} MiB free, {HEADROOM_MIB} kept"
    return True, ""


def run_once(variant: str, point: str, repo: Path, wait_s: float) -> dict[str, Any]:
    models = point_models(point)
    fits, why = room_for(variant, len(models))
    if not fits:
        log(f"{point} {variant}: skipped, {why}")
        return {"skipped": why}
    load = quiet(wait_s)
    log(f"{point} {variant}: start (load {load})")
    try:
        if variant == "mlserver":
            result = measure_mlserver(models, repo)
        else:
            result = measure_appliance(variant, models, repo)
    except (servers.PeerUnavailable, RuntimeError, TimeoutError) as error:
        log(f"{point} {variant}: failed: {error}")
        return {"failed": str(error)[:2000], "load": load}
    result["load"] = load
    result["load_after"] = round(os.getloadavg()[0], 2)
    log(
        f"{point} {variant}: ready {result['ready_s']:.1f} s, {result['all_mib']:.0f} MiB in "
        f"all, cold {result['cold_ms']}, warm {result['warm_ms']:.2f} ms"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 10 models, one round")
    parser.add_argument("--rounds", type=int, help="rounds of every point (3; quick 1)")
    parser.add_argument("--points", help=f"comma-separated, of {','.join(POINTS)}")
    parser.add_argument("--variants", help=f"comma-separated, of {','.join(VARIANTS)}")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        help=f"the longest wait per run for a quiet host, s ({QUIET_WAIT_S:.0f}; quick 0)",
    )
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    points = args.points.split(",") if args.points else (["1", "10"] if args.quick else POINTS)
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    wait_s = (
        args.quiet_wait if args.quiet_wait is not None else (0.0 if args.quick else QUIET_WAIT_S)
    )
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        point: {variant: [] for variant in variants} for point in points
    }
    record: dict[str, Any] = {"args": vars(args), "runs": runs, "cut_short": False}
    signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    quiet(wait_s)
    record["ring_touch"] = ring_touch()
    for row in record["ring_touch"]:
        log(f"ring touch: {row}")
    with tempfile.TemporaryDirectory(prefix="bench-models-repo-") as repo_dir:
        repo = Path(repo_dir)
        repository(point_models("mixed"), repo)
        try:
            for index in range(rounds):
                # The shared host drifts: every other round runs the variants backwards.
                ordered = variants if index % 2 == 0 else variants[::-1]
                for point in points:
                    for variant in ordered:
                        runs[point][variant].append(run_once(variant, point, repo, wait_s))
        except KeyboardInterrupt:
            record["cut_short"] = True
            log("stopped: writing what was measured so far")
    summaries = {
        point: {variant: summarize(runs[point][variant]) for variant in variants}
        for point in points
    }
    record["summary"] = summaries
    record["elapsed_s"] = time.monotonic() - began
    name = "models-quick" if args.quick else "models"
    write_results(RESULTS / f"{name}.json", **record)
    text = table(summaries) + "\n" + touch_table(record["ring_touch"])
    text += "\n" + large_table(summaries)
    (RESULTS / f"{name}.md").write_text(text)
    if not args.quick:
        update(PAGE, text, "bench-models")
    print(text)
    return 0


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
