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
import subprocess
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

from appliance.config.reader import load  # noqa: E402
from bench import servers  # noqa: E402
from bench.doc_tables import PAGE, update  # noqa: E402
from bench.loadgen import write_results  # noqa: E402
from tests.system.harness import Appliance, make_config, new_run_dir, start  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MiB = 1 << 20
QUIET_LOAD = 1.5
QUIET_WAIT_S = 600.0
# After ready, before memory is read: the last workers finish their start.
IDLE_S = 3.0
COLD_SAMPLES = 5
# From this many models, a run also measures what reading the host's state costs.
LARGE = 200
WARM_CALLS = 20
READY_TIMEOUT_S = 900.0
VARIANTS = ("before", "exec", "zygote", "mlserver")
POINTS = ("1", "10", "50", "200", "mixed")
REPOSITORY = ROOT / "appliance" / "demos" / "repository"
# Rough MiB per model and fixed MiB, to skip a run the host has no room for.
NEED_MIB = {"before": (70, 600), "exec": (35, 600), "zygote": (12, 600), "mlserver": (6, 400)}
HEADROOM_MIB = 3072
SIMPLE_BODY = {
    "inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
}
DIGITS_BODY = {
    "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]
}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def quiet(wait_s: float) -> float:
    """Wait until the host's 1-minute load is below QUIET_LOAD (at most ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(5.0)
    return round(os.getloadavg()[0], 2)


def point_models(point: str) -> list[tuple[str, str]]:
    """(name, kind) of every model in a point; kind: simple, onnx or torch."""
    if point == "mixed":
        models = [(f"simple{i}", "simple") for i in range(20)]
        models += [(f"onnx{i}", "onnx") for i in range(4)]
        return models + [(f"torch{i}", "torch") for i in range(4)]
    return [(f"simple{i}", "simple") for i in range(int(point))]


def repository(models: list[tuple[str, str]], where: Path) -> None:
    """Copies of the demo repository's ONNX and TorchScript digits, one per model."""
    sources = {"onnx": "digits_onnx", "torch": "digits_torch"}
    for name, kind in models:
        if kind in sources:
            shutil.copytree(REPOSITORY / sources[kind], where / name)


# -- memory ------------------------------------------------------------------


def smaps(pid: int) -> dict[str, int]:
    """/proc/<pid>/smaps_rollup in bytes: Pss, Pss_Shmem, and USS (its private pages)."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                fields[key] = int(parts[0]) * 1024
    return {
        "uss": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
        "pss": fields.get("Pss", 0),
        "pss_shmem": fields.get("Pss_Shmem", 0),
    }


def tree_memory(root: int, shm_prefix: str | None, models: set[int]) -> dict[str, Any]:
    """The tree's memory counted once, and its model workers' USS and PSS."""
    processes = [psutil.Process(root)]
    with contextlib.suppress(psutil.Error):
        processes += processes[0].children(recursive=True)
    total = 0
    workers = []
    for process in processes:
        with contextlib.suppress(OSError):
            figures = smaps(process.pid)
            total += figures["pss"] - figures["pss_shmem"]
            if process.pid in models:
                workers.append(figures)
    shm = 0
    if shm_prefix:
        for entry in os.scandir("/dev/shm"):
            if entry.name.startswith(shm_prefix):
                with contextlib.suppress(OSError):
                    shm += entry.stat().st_blocks * 512
    return {
        "processes": len(processes),
        "processes_mib": total / MiB,
        "shm_mib": shm / MiB,
        "all_mib": (total + shm) / MiB,
        "worker_uss_mib": statistics.median(w["uss"] for w in workers) / MiB if workers else None,
        "worker_pss_mib": statistics.median(w["pss"] for w in workers) / MiB if workers else None,
    }


# -- calls ---------------------------------------------------------------------


def latencies(base: str, models: list[tuple[str, str]]) -> dict[str, Any]:
    """First calls to models never called (ms, by kind), then warm calls to one of them."""
    bodies = {"simple": SIMPLE_BODY, "onnx": DIGITS_BODY, "torch": DIGITS_BODY}
    by_kind: dict[str, list[tuple[str, str]]] = {}
    for name, kind in models:
        by_kind.setdefault(kind, []).append((name, kind))
    cold: dict[str, list[float]] = {}
    with requests.Session() as session:
        # The connection is open before the clock runs: cold means the model, not TCP.
        session.get(f"{base}/v2/health/live", timeout=30)
        for kind, named in by_kind.items():
            for name, _kind in named[:COLD_SAMPLES]:
                cold.setdefault(kind, []).append(call(session, base, name, bodies[kind]))
        name, kind = models[0]
        warm = [call(session, base, name, bodies[kind]) for _ in range(WARM_CALLS)]
    return {
        "cold_ms": {kind: statistics.median(values) for kind, values in cold.items()},
        "cold_samples_ms": cold,
        "warm_ms": statistics.median(warm),
    }


def call(session: requests.Session, base: str, model: str, body: dict[str, Any]) -> float:
    began = time.perf_counter()
    reply = session.post(f"{base}/v2/models/{model}/infer", json=body, timeout=120)
    elapsed = (time.perf_counter() - began) * 1000
    if reply.status_code != 200:
        raise RuntimeError(f"{model}: HTTP {reply.status_code}: {reply.text[:200]}")
    return elapsed


# -- the appliance ---------------------------------------------------------------


def appliance_config(variant: str, models: list[tuple[str, str]], repo: Path) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    for name, kind in models:
        if kind == "simple":
            entries.append({"name": name, "class": "appliance.demos.simple:Simple"})
    if variant == "before":
        for entry in entries:
            entry["response_ring_bytes"] = 32 * MiB
    config = make_config(
        new_run_dir(),
        entries,
        server={"model_start": "exec" if variant == "before" else variant, "log_level": "warning"},
        http={"workers": 1},
        grpc={"workers": 1},
        mip={"workers": 1},
    )
    # The shipped defaults (32 MiB rings), not the tests' 8 MiB.
    del config["shm"]
    config["server"]["access_log"] = False
    if any(kind != "simple" for _name, kind in models):
        config["repositories"] = [{"path": str(repo)}]
    return config


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
        memory = tree_memory(
            appliance.process.pid, f"appliance-{appliance.tree}-", workers
        )
        base = f"http://127.0.0.1:{appliance.ports['http']}"
        calls = latencies(base, models)
        large = large_config(appliance, base, models) if len(models) >= LARGE else {}
    return {"ready_s": ready_s, "forked": forked, **memory, **calls, **large}


def large_config(appliance: Appliance, base: str, models: list[tuple[str, str]]) -> dict[str, Any]:
    """What reading the state of a host with many models costs, once each model was called
    over KServe REST: /metrics (the first scrape of a worker, then later ones), the
    dashboard's state, ``ctl status`` (its reply, and the text), and a scan of a model
    repository of as many directories."""
    with requests.Session() as session:
        for name, kind in models:
            if kind == "simple":
                call(session, base, name, SIMPLE_BODY)
        time.sleep(2.5)  # the workers publish their counters
        scrapes = []
        for _ in range(6):
            began = time.perf_counter()
            reply = session.get(f"{base}/metrics", timeout=60)
            scrapes.append((time.perf_counter() - began) * 1000)
        size = len(reply.content)
        dashboard = []
        for _ in range(5):
            began = time.perf_counter()
            session.get(f"{base}/dashboard/state", timeout=60).raise_for_status()
            dashboard.append((time.perf_counter() - began) * 1000)
    replies = []
    for _ in range(5):
        began = time.perf_counter()
        appliance.ctl("status")
        replies.append((time.perf_counter() - began) * 1000)
    began = time.perf_counter()
    text = subprocess.run(
        [sys.executable, "-m", "appliance", "ctl", "--socket", str(appliance.control), "status"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    ctl_ms = (time.perf_counter() - began) * 1000
    with tempfile.TemporaryDirectory(prefix="bench-models-scan-") as where:
        for index in range(len(models)):
            shutil.copytree(REPOSITORY / "digits_onnx", Path(where, f"d{index}"))
        config = Path(where, "config.toml")
        config.write_text(f'[[repositories]]\npath = "{where}"\n')
        scans = []
        for _ in range(5):
            began = time.perf_counter()
            scanned = load(config)
            scans.append((time.perf_counter() - began) * 1000)
    assert len(scanned.models) == len(models)
    return {
        "metrics_first_ms": scrapes[0],
        "metrics_ms": statistics.median(scrapes[1:]),
        "metrics_bytes": size,
        "dashboard_state_ms": statistics.median(dashboard),
        "ctl_status_reply_ms": statistics.median(replies),
        "ctl_status_command_ms": ctl_ms,
        "ctl_status_lines": len(text.splitlines()),
        "repository_scan_ms": statistics.median(scans),
    }


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
        runtimes = {"simple": "Simple", "onnx": "OnnxDigits", "torch": "TorchDigits"}
        files = {"onnx": "1/model.onnx", "torch": "1/model.pt"}
        for name, kind in models:
            body: dict[str, Any] = {
                "name": name,
                "implementation": f"mlserver_many.{runtimes[kind]}",
            }
            if kind in files:
                body["parameters"] = {"uri": str(repo / name / files[kind])}
            Path(home, name).mkdir()
            Path(home, name, "model-settings.json").write_text(json.dumps(body))
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


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of every figure a table shows."""
    done = [run for run in runs if "ready_s" in run]
    if not done:
        return {"skipped": (runs[0] if runs else {}).get("skipped", "no run")}
    keys = ("ready_s", "processes_mib", "shm_mib", "all_mib", "worker_uss_mib")
    keys += ("worker_pss_mib", "warm_ms", "load", "metrics_first_ms", "metrics_ms")
    keys += ("metrics_bytes", "dashboard_state_ms", "ctl_status_reply_ms")
    keys += ("ctl_status_command_ms", "ctl_status_lines", "repository_scan_ms")
    summary: dict[str, Any] = {"rounds": len(done)}
    for key in keys:
        values = [run[key] for run in done if run.get(key) is not None]
        summary[key] = statistics.median(values) if values else None
    kinds = {kind for run in done for kind in run["cold_ms"]}
    summary["cold_ms"] = {
        kind: statistics.median(run["cold_ms"][kind] for run in done if kind in run["cold_ms"])
        for kind in sorted(kinds)
    }
    return summary


def table(summaries: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The table: one row per point and variant, medians over rounds."""
    lines = [
        "| models | start | ready s | memory in all MiB | per model MiB | worker USS / PSS MiB "
        "| /dev/shm MiB | cold first request ms | warm ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point, by_variant in summaries.items():
        count = len(point_models(point))
        for variant, row in by_variant.items():
            if "ready_s" not in row:
                lines.append(f"| {point} | {variant} | skipped: {row.get('skipped')} |||||||")
                continue
            base = summaries.get("1", {}).get(variant, {})
            per = (
                (row["all_mib"] - base["all_mib"]) / (count - 1)
                if count > 1 and "all_mib" in base
                else None
            )
            worker = (
                f"{row['worker_uss_mib']:.1f} / {row['worker_pss_mib']:.1f}"
                if row.get("worker_uss_mib") is not None
                else "(one process)"
            )
            cold = ", ".join(f"{kind} {ms:.1f}" for kind, ms in row["cold_ms"].items())
            lines.append(
                f"| {point} | {variant} | {row['ready_s']:.1f} | {row['all_mib']:.0f} | "
                f"{'-' if per is None else f'{per:.1f}'} | {worker} | {row['shm_mib']:.0f} | "
                f"{cold} | {row['warm_ms']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def large_table(summaries: dict[str, dict[str, dict[str, Any]]]) -> str:
    """What reading the state of a host with LARGE models costs, per variant that ran it."""
    names = {
        "metrics_first_ms": "/metrics, a worker's first scrape, ms",
        "metrics_ms": "/metrics, later scrapes, ms",
        "metrics_bytes": "/metrics, bytes",
        "dashboard_state_ms": "dashboard state, ms",
        "ctl_status_reply_ms": "ctl status reply, ms",
        "ctl_status_command_ms": "`appliance ctl status` command, ms",
        "ctl_status_lines": "`appliance ctl status` lines",
        "repository_scan_ms": f"scan of a repository of {LARGE} directories, ms",
    }
    found = [
        (point, variant, row)
        for point, by_variant in summaries.items()
        for variant, row in by_variant.items()
        if row.get("metrics_ms") is not None
    ]
    if not found:
        return ""
    head = " | ".join(f"{point} {variant}" for point, variant, _row in found)
    lines = [f"| with {LARGE} models | {head} |", "|---|" + "---|" * len(found)]
    for key, label in names.items():
        cells = " | ".join(f"{row[key]:,.0f}" for _point, _variant, row in found)
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines) + "\n"


def touch_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| response ring | pre-faulted by the worker | making it ms "
        "| a frontend's first attach ms |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['ring_mib']} MiB | {'yes' if row['prefault'] else 'no'} | "
            f"{row['create_ms']:.2f} | {row['first_attach_ms']:.2f} |"
        )
    return "\n".join(lines) + "\n"


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
