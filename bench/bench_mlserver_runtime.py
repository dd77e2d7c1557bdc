"""MLServer's scikit-learn runtime served by MLServer and by the appliance: one folder, two servers.

The folder is one ``model-settings.json`` of ``mlserver_sklearn.SKLearnModel``
with a small SVM (tests/mlserver_models.py's ``mnist-svm``). ``mlserver
start`` serves it (MLServer 1.7.1 with its runtimes, bench/.peers/mlserver-runtimes,
parallel_workers 1: one inference process) and the appliance serves the same
folder (one instance: settings.json's parallel_workers, 1 by default). The same
class, unmodified, answers in both.

Cells: KServe REST (tritonclient.http with JSON tensors: MLServer has no
binary tensor extension) and gRPC (tritonclient.grpc), one row of four
features in, the predicted class out; 1 and 16 clients in closed loops
(bench/loadgen.py's client processes, threads past four). Rounds interleave
the servers; the table holds medians over rounds. Server CPU per request is
each server's whole process tree. Results go to
bench/results/mlserver_runtime.json. Usage::

    python bench/bench_mlserver_runtime.py [--seconds S] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loadgen import (  # noqa: E402
    ClientPool,
    ProcessTree,
    appliance_serving,
    median_row,
    print_cells,
    round_arguments,
    write_results,
)
from bench.servers import PeerUnavailable, mlserver_folder  # noqa: E402
from tests.mlserver_models import write_folder  # noqa: E402
from tests.system.harness import make_config, new_run_dir  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "mlserver_runtime.json"
MODEL = "mnist-svm"
ROW = np.array([[5.9, 2.8, 4.3, 1.3]], dtype=np.float32)
PROTOCOLS = ("rest", "grpc")
CLIENTS = (1, 16)
POOL = 4
PRELOAD = ("tritonclient.grpc", "tritonclient.http")


def make_call(spec: dict[str, Any], shared: dict[str, Any]) -> Callable[[], None]:
    """One inference of the SVM over ``spec["protocol"]``; raises unless it says class 1."""
    del shared
    if spec["protocol"] == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    client = module.InferenceServerClient(spec["url"])
    rest = spec["protocol"] == "rest"

    def call() -> None:
        value = module.InferInput("predict", list(ROW.shape), "FP32")
        if rest:
            value.set_data_from_numpy(ROW, binary_data=False)
            wanted = [module.InferRequestedOutput("predict", binary_data=False)]
        else:
            value.set_data_from_numpy(ROW)
            wanted = [module.InferRequestedOutput("predict")]
        result = client.infer(MODEL, [value], outputs=wanted)
        if int(result.as_numpy("predict").reshape(-1)[0]) != 1:
            raise AssertionError(f"{MODEL} predicted another class")

    return call


@contextlib.contextmanager
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-mlserver-folder-") as where:
        root = Path(where)
        for name in write_folder(root, only=("sklearn",)):
            if name != MODEL:
                shutil.rmtree(root / name)
        yield root


def appliance(models: Path) -> contextlib.AbstractContextManager[dict[str, Any]]:
    config = make_config(new_run_dir(), [])
    config["repositories"] = [{"path": str(models)}]
    return appliance_serving(config)


Runs = dict[str, dict[str, list[dict[str, Any]]]]


def measure(pool: ClientPool, servers: dict[str, dict[str, Any]], args: argparse.Namespace) -> Runs:
    runs: Runs = {}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr)
        for protocol in PROTOCOLS:
            for clients in CLIENTS:
                cell = f"{protocol} {clients}c"
                for server, where in servers.items():
                    url = where["urls"]["http" if protocol == "rest" else "grpc"]
                    spec = {"protocol": protocol, "url": url}
                    row = pool.measure(spec, clients, args.seconds, ProcessTree(where["pid"]))
                    if row["errors"]:
                        raise RuntimeError(f"{server} {cell}: {row['error']}")
                    runs.setdefault(cell, {}).setdefault(server, []).append(row)
    return runs


def main() -> int:
    args = round_arguments(__doc__.split("\n")[0], 1.0)
    with contextlib.ExitStack() as stack:
        models = stack.enter_context(folder())
        servers = {"appliance": stack.enter_context(appliance(models))}
        try:
            peer = stack.enter_context(mlserver_folder(models))
            servers["mlserver"] = {"urls": peer.urls, "pid": peer.process.pid}
        except PeerUnavailable as ex:
            print(f"MLServer left out: {ex}", file=sys.stderr)
        pool = stack.enter_context(ClientPool(POOL, make_call, preload=PRELOAD))
        runs = measure(pool, servers, args)
    table = {
        cell: {server: median_row(rows) for server, rows in by_server.items()}
        for cell, by_server in runs.items()
    }
    print_cells(table)
    write_results(
        RESULTS,
        seconds=args.seconds,
        rounds=args.rounds,
        mlserver="1.7.1" if "mlserver" in servers else None,
        summary=table,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
