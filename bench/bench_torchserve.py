"""A TorchServe archive served by TorchServe 0.12 and by the appliance: one store, two servers.

The archive is pytorch/serve's MNIST network (examples/image_classifier/mnist's
``Net``, random weights) with an eager-model handler that subclasses
``BaseHandler`` and decodes a 28x28 PNG with Pillow and torch: the mnist
example's own handler needs torchvision, whose CPU build this host's
registries do not have. TorchServe serves it with one Python worker
(bench/.peers/torchserve, CPU torch), the appliance with one instance; the
handler is the same file, unmodified.

Cells: TorchServe's inference API (``POST /predictions/digits``, the PNG as
the body, http.client keep-alive), 1 and 16 clients in closed loops
(bench/loadgen.py's client processes). Rounds interleave the servers; the
table holds medians over rounds. Server CPU per request is each server's
whole process tree (TorchServe's Java frontend and Python worker; the
appliance's every process). Results go to bench/results/torchserve.json. Usage::

    python bench/bench_torchserve.py [--seconds S] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loadgen import (  # noqa: E402
    ClientPool,
    ProcessTree,
    median_row,
    print_cells,
    round_arguments,
    write_results,
)
from bench.servers import PeerUnavailable  # noqa: E402
from bench.torchserve_peer import torchserve  # noqa: E402
from tests.system.model_store import serving_model_store  # noqa: E402
from tests.torch_archives import write_digits_mar  # noqa: E402
from tests.torchserve_models import digit_png  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "torchserve.json"
MODEL = "digits"
CLIENTS = (1, 16)
POOL = 4


def make_call(spec: dict[str, Any], shared: dict[str, Any]) -> Callable[[], None]:
    """One prediction over a keep-alive connection; raises unless it answers a digit."""
    del shared
    import http.client

    host, port = spec["address"].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    body = base64.b64decode(spec["png"])
    headers = {"Content-Type": "application/octet-stream", **spec.get("headers", {})}

    def call() -> None:
        connection.request("POST", f"/predictions/{MODEL}", body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        if answer.status != 200 or not data.strip().isdigit():
            raise AssertionError(f"{answer.status}: {data[:200]!r}")

    return call


@contextlib.contextmanager
def model_store() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-torchserve-") as where:
        root = Path(where)
        write_digits_mar(root / "store", root / "work")
        yield root / "store"


@contextlib.contextmanager
def appliance(store: Path) -> Iterator[dict[str, Any]]:
    with serving_model_store(store) as served:
        yield {"address": f"127.0.0.1:{served.ports['http']}", "pid": served.process.pid}


Runs = dict[str, dict[str, list[dict[str, Any]]]]


def measure(pool: ClientPool, servers: dict[str, dict[str, Any]], args: argparse.Namespace) -> Runs:
    runs: Runs = {}
    png = base64.b64encode(digit_png()).decode()  # a spec travels as JSON
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr)
        for clients in CLIENTS:
            cell = f"predictions {clients}c"
            for server, where in servers.items():
                spec = {"address": where["address"], "png": png}
                row = pool.measure(spec, clients, args.seconds, ProcessTree(where["pid"]))
                if row["errors"]:
                    raise RuntimeError(f"{server} {cell}: {row['error']}")
                runs.setdefault(cell, {}).setdefault(server, []).append(row)
    return runs


def main() -> int:
    args = round_arguments(__doc__.split("\n")[0], 1.0)
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(model_store())
        servers = {"appliance": stack.enter_context(appliance(store))}
        try:
            peer = stack.enter_context(torchserve(store, "all"))
            address = peer.urls["inference"].removeprefix("http://")
            servers["torchserve"] = {"address": address, "pid": peer.process.pid}
        except PeerUnavailable as ex:
            print(f"TorchServe left out: {ex}", file=sys.stderr)
        pool = stack.enter_context(ClientPool(POOL, make_call))
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
        torchserve="0.12.0" if "torchserve" in servers else None,
        summary=table,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
