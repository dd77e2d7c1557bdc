"""MIP round trips: TENSOR items against ``identity``, and KubeMo's own server.

Sizes 64 B, 16 KiB and 1 MiB (FP32 tensors), in the same run:

- tensor: our client (``appliance.protocols.mip.client``), one persistent
  connection per thread, a TENSOR item per request, batch 1, against a MIP
  listener serving ``identity``; 1 and 4 connections;
- internal: the same tensor through ``ModelClient.infer`` from this process
  (the core's round trip without MIP), and through ``infer_async`` in an
  event loop (what the MIP frontend calls: no spin-wait, a loop wake-up);
- tcp: the same frames through a bare asyncio server in a subprocess that
  sends each frame straight back (loopback TCP and asyncio, no model):
  with async ``internal``, the floor MIP adds to;
- kubemo: KubeMo's stock client (a connection per request, a TEXT item of
  the same byte size) against the appliance's ``echo`` listener, and against
  KubeMo's own ``Server`` (PyPI 0.0.dev2) in a subprocess with an identity
  ``Inference``: the peer server, with the peer client, on the same bytes.

Each measurement is repeated; the table shows medians over repeats and the
ratios of those medians; bench/results/mip.json holds every repeat. Usage::

    python bench/bench_mip.py [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from kubemo.client import Client as KubemoClient
from kubemo.serialize import Text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from appliance.protocols.mip.client import (  # noqa: E402
    MipClient,
    decode_item,
    encode_request,
    tensor_item,
)
from bench.loadgen import latency_stats, thread_loop, write_results  # noqa: E402
from tests.system.harness import demo_models, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "mip.json"
MiB = 1 << 20
SIZES = {"64B": 64, "16KiB": 16 << 10, "1MiB": MiB}
COUNTS = {"64B": 2000, "16KiB": 1500, "1MiB": 300}
KUBEMO_COUNTS = {"64B": 600, "16KiB": 500, "1MiB": 100}
INFLIGHT = (1, 4)

REFERENCE_SERVER = """
import io, sys
from kubemo.inference import Inference
from kubemo.serialize import Text
from kubemo.server import InferenceHandler, Server

class Identity(Inference):
    def preprocess(self, inputs):
        return tuple(x.encode() for x in inputs)
    def concat(self, batch):
        return tuple(zip(*batch))
    def forward(self, inputs):
        return inputs
    def postprocess(self, outputs):
        return tuple(Text(io.BytesIO(y)) for y in outputs)

server = Server("tcp", ("127.0.0.1", int(sys.argv[1])))
server.handle(InferenceHandler(Identity()))
print("ready", flush=True)
server.serve()
"""

TCP_SERVER = """
import asyncio, struct, sys

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, bytearray()
    def data_received(self, data):
        self.buffer += data
        while len(self.buffer) >= 8:
            size = 8 + struct.unpack("!L", self.buffer[4:8])[0]
            if len(self.buffer) < size:
                return
            self.transport.write(bytes(self.buffer[:size]))
            del self.buffer[:size]

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


def tensor(nbytes: int) -> np.ndarray:
    return np.random.default_rng(0).random(max(1, nbytes // 4), dtype=np.float32)


def measure(call: Callable[[int], None], count: int, inflight: int) -> dict[str, float]:
    """Run ``count`` calls from ``inflight`` threads; ``call(i)`` knows its thread."""
    warmup = max(1, count // 10 // inflight)
    return thread_loop(lambda index: lambda: call(index), count, inflight, warmup)


def tensor_path(port: int, x: np.ndarray, count: int, inflight: int) -> dict[str, float]:
    clients = [MipClient("127.0.0.1", port) for _ in range(inflight)]
    item = tensor_item(x)

    def call(index: int) -> None:
        [[out]] = clients[index].infer([[item]])
        y = decode_item(out)
        if y.shape != x.shape or y[0] != x[0] or y[-1] != x[-1]:
            raise AssertionError("identity returned other data over MIP")

    try:
        return measure(call, count, inflight)
    finally:
        for client in clients:
            client.close()


def internal_path(client: Any, x: np.ndarray, count: int) -> dict[str, float]:
    batch = x[np.newaxis]

    def call(_index: int) -> None:
        with client.infer("identity", {"INPUT0": batch}) as result:
            if result.array("OUTPUT0").shape != batch.shape:
                raise AssertionError("identity returned another shape")

    return measure(call, count, 1)


def internal_async_path(client: Any, x: np.ndarray, count: int) -> dict[str, float]:
    batch = x[np.newaxis]

    async def loop() -> list[float]:
        latencies = []
        for _ in range(count // 10 + count):
            start = time.perf_counter()
            with await client.infer_async("identity", {"INPUT0": batch}) as result:
                if result.array("OUTPUT0").shape != batch.shape:
                    raise AssertionError("identity returned another shape")
            latencies.append(time.perf_counter() - start)
        return latencies

    began = time.perf_counter()
    latencies = asyncio.run(loop())
    elapsed = (time.perf_counter() - began) * count / len(latencies)
    return {**latency_stats(latencies[count // 10 :], elapsed), "elapsed_s": elapsed}


def kubemo_path(url: str, data: bytes, count: int) -> dict[str, float]:
    client = KubemoClient()

    def call(_index: int) -> None:
        [[out]] = client.inference(url, ((Text(io.BytesIO(data)),),))
        if len(out.encode()) != len(data):
            raise AssertionError("the echo came back with another size")

    return measure(call, count, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tcp_path(port: int, x: np.ndarray, count: int) -> dict[str, float]:
    client = MipClient("127.0.0.1", port)
    frame = encode_request([[tensor_item(x)]])

    def call(_index: int) -> None:
        client.sock.sendall(frame)
        client.receive()

    try:
        return measure(call, count, 1)
    finally:
        client.close()


@contextlib.contextmanager
def server_process(code: str) -> Iterator[int]:
    """Run a server script in a subprocess on a free port until the block ends."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("a reference server did not start")
        yield port
    finally:
        process.kill()
        process.wait(10)


def one_repeat(
    appliance: Any,
    client: Any,
    ports: tuple[int, int],
    counts: dict[str, int],
    kcounts: dict[str, int],
) -> dict[str, dict[str, dict[str, float]]]:
    listeners = {x["model"]: int(x["port"]) for x in appliance.state["mip_listeners"]}
    echo_url = f"tcp://127.0.0.1:{listeners['echo']}"
    reference = f"tcp://127.0.0.1:{ports[0]}"
    run: dict[str, dict[str, dict[str, float]]] = {}
    for size, nbytes in SIZES.items():
        x = tensor(nbytes)
        data = x.tobytes()
        row = {
            f"tensor_{n}": tensor_path(listeners["identity"], x, counts[size], n) for n in INFLIGHT
        }
        row["internal_1"] = internal_path(client, x, counts[size])
        row["internal_async_1"] = internal_async_path(client, x, counts[size])
        row["tcp_1"] = tcp_path(ports[1], x, counts[size])
        row["kubemo_appliance"] = kubemo_path(echo_url, data, kcounts[size])
        row["kubemo_reference"] = kubemo_path(reference, data, kcounts[size])
        run[size] = row
    return run


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    table = {}
    for size in SIZES:
        row: dict[str, float] = {}
        for path in runs[0][size]:
            for key in ("p50_us", "p99_us", "rps"):
                row[f"{path}_{key}"] = statistics.median(run[size][path][key] for run in runs)
        nbytes = SIZES[size]
        for n in INFLIGHT:
            row[f"tensor_{n}_gbps"] = row[f"tensor_{n}_rps"] * nbytes * 2 / 1e9
        row["tensor_1_over_internal_p50"] = row["tensor_1_p50_us"] / row["internal_1_p50_us"]
        row["tensor_1_over_floor_p50"] = row["tensor_1_p50_us"] / (
            row["internal_async_1_p50_us"] + row["tcp_1_p50_us"]
        )
        row["tensor_4_over_1_rps"] = row["tensor_4_rps"] / row["tensor_1_rps"]
        row["kubemo_appliance_over_reference_p50"] = (
            row["kubemo_appliance_p50_us"] / row["kubemo_reference_p50_us"]
        )
        table[size] = row
    return table


def report(table: dict[str, Any]) -> None:
    print(
        f"\n{'size':>6} {'MIP p50':>9} {'MIP p99':>9} {'req/s 1':>8} {'req/s 4':>8} "
        f"{'GB/s 4':>7} {'core':>6} {'async':>6} {'tcp':>6} {'x floor':>8} {'km app':>9} "
        f"{'km ref':>9} {'app/ref':>8}"
    )
    for size, row in table.items():
        print(
            f"{size:>6} {row['tensor_1_p50_us']:>8.0f}u {row['tensor_1_p99_us']:>8.0f}u "
            f"{row['tensor_1_rps']:>8.0f} {row['tensor_4_rps']:>8.0f} "
            f"{row['tensor_4_gbps']:>7.2f} {row['internal_1_p50_us']:>5.0f}u "
            f"{row['internal_async_1_p50_us']:>5.0f}u "
            f"{row['tcp_1_p50_us']:>5.0f}u {row['tensor_1_over_floor_p50']:>8.2f} "
            f"{row['kubemo_appliance_p50_us']:>8.0f}u "
            f"{row['kubemo_reference_p50_us']:>8.0f}u "
            f"{row['kubemo_appliance_over_reference_p50']:>8.2f}"
        )
    print(
        "\nMIP: TENSOR items, persistent connection, identity (p50/p99 at 1 connection;"
        " GB/s counts both directions)\ncore / async: ModelClient.infer / infer_async p50, no MIP."
        "  tcp: a bare asyncio server echoing the same frames\nx floor: MIP p50 / (async + tcp)."
        "  km: KubeMo's client,"
        " a connection per request, TEXT item, appliance echo vs KubeMo's own server"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer requests, for a smoke run")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    counts = {k: max(20, v // scale) for k, v in COUNTS.items()}
    kcounts = {k: max(10, v // scale) for k, v in KUBEMO_COUNTS.items()}
    listeners = [{"port": 0, "model": "identity"}, {"port": 0, "model": "echo"}]
    shm = {"request_ring_bytes": 64 * MiB, "response_ring_bytes": 64 * MiB}
    runs = []
    with (
        running(demo_models("identity", "echo"), mip={"listeners": listeners}, shm=shm) as app,
        server_process(REFERENCE_SERVER) as reference,
        server_process(TCP_SERVER) as tcp,
    ):
        client = app.client()
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
            runs.append(one_repeat(app, client, (reference, tcp), counts, kcounts))
    table = summarise(runs)
    report(table)
    write_results(
        RESULTS,
        repeats=args.repeats,
        counts=counts,
        kubemo_counts=kcounts,
        summary=table,
        runs=runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
