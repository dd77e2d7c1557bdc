"""GRPS end to end against ``identity``, and the JSON codec against protobuf's.

Two questions, answered in one run:

1. Serving. Client processes each run a closed loop (one request in flight
   per process) for a fixed time, per mode and tensor size (FP32):

   - ``rest-json``: POST /grps/v1/infer/predict with gtensors JSON (the
     client encodes and parses the JSON with orjson, as a fast client would);
   - ``grpc``: GrpsService/Predict with a GenericTensor (stubs from
     protos/grps.proto);
   - ``kserve-grpc``: tritonclient.grpc to the same model, raw tensor bytes
     (the appliance's fastest wire protocol, for a ratio);
   - ``direct``: the internal ModelClient, the floor every protocol adds to.

2. Codec. In this process, encode a reply and decode a request of the same
   tensor with the appliance's GRPS JSON codec, and with protobuf's
   json_format (MessageToJson / ParseDict, what GRPS's own Python server
   does), and with the GenericTensor protobuf path.

Each configuration is repeated; tables show medians over repeats, and
bench/results/grps.json holds every repeat. Usage::

    python bench/bench_grps.py [--clients N] [--seconds S] [--repeats R] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.loadgen import (  # noqa: E402
    ClientPool,
    ProcessTree,
    median_row,
    mode_call,
    mode_grid,
    tensor,
    write_results,
)
from tests.system.harness import demo_models, running  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "grps.json"
MiB = 1 << 20
SIZES = {"64B": 64, "16KiB": 16 << 10, "1MiB": MiB}
MODES = ("rest-json", "grpc", "kserve-grpc", "direct")


def gtensors_json(x: np.ndarray) -> bytes:
    tensor = {"dtype": "DT_FLOAT32", "shape": list(x.shape), "flat_float32": x.reshape(-1)}
    return orjson.dumps(
        {"model": "identity", "gtensors": {"tensors": [tensor]}}, option=orjson.OPT_SERIALIZE_NUMPY
    )


class Caller:
    """One client process's ways of calling ``identity``."""

    def __init__(self, ports: dict[str, int], run_dir: str) -> None:
        import grpc
        import requests
        import tritonclient.grpc as grpcclient

        from appliance._generated import grps_pb2, grps_pb2_grpc
        from appliance.client.api import ModelClient

        self.pb, self.grpcclient = grps_pb2, grpcclient
        self.session = requests.Session()
        self.url = f"http://127.0.0.1:{ports['http']}/grps/v1/infer/predict"
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{ports['grpc']}", options=[("grpc.max_receive_message_length", 1 << 30)]
        )
        self.stub = grps_pb2_grpc.GrpsServiceStub(self.channel)
        self.kserve = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        self.direct = ModelClient.connect(Path(run_dir))

    def call(self, mode: str, x: np.ndarray) -> None:
        if mode == "direct":
            with self.direct.infer("identity", {"INPUT0": x}) as result:
                check(result.array("OUTPUT0")[0, -1], x)
        elif mode == "rest-json":
            reply = self.session.post(
                self.url, data=gtensors_json(x), headers={"Content-Type": "application/json"}
            )
            values = orjson.loads(reply.content)["gtensors"]["tensors"][0]["flat_float32"]
            check(np.float32(values[-1]), x)
        elif mode == "grpc":
            request = self.pb.GrpsMessage(model="identity")
            request.gtensors.tensors.add(dtype=self.pb.DT_FLOAT32, shape=x.shape)
            request.gtensors.tensors[0].flat_float32.extend(x.reshape(-1).tolist())
            reply = self.stub.Predict(request)
            check(np.float32(reply.gtensors.tensors[0].flat_float32[-1]), x)
        else:
            value = self.grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            value.set_data_from_numpy(x)
            check(self.kserve.infer("identity", [value]).as_numpy("OUTPUT0")[0, -1], x)

    def close(self) -> None:
        self.session.close()
        self.channel.close()
        self.kserve.close()
        self.direct.close()


def check(last: Any, x: np.ndarray) -> None:
    if last != x[0, -1]:
        raise AssertionError("identity returned other data than it was sent")


def codec_times(nbytes: int, budget_s: float = 0.5) -> dict[str, float]:
    """Return ms per reply-encode + request-decode of one tensor, per codec."""
    from google.protobuf import json_format

    from appliance.core.tensor import Tensor
    from appliance.protocols.grps import codec, pbcodec
    from appliance.protocols.grps.payload import Kind, Payload

    x = tensor(nbytes)
    payload = Payload(Kind.GTENSORS, tensors=[("x", Tensor.from_array(x))])
    message = pbcodec.encode_message(payload)

    def ours() -> None:
        codec.decode_json_request(codec.encode_json_reply(payload))

    def protobuf_json() -> None:
        text = json_format.MessageToJson(message, preserving_proto_field_name=True, indent=1)
        json_format.ParseDict(orjson.loads(text), pbcodec.GrpsMessage(), ignore_unknown_fields=True)

    def protobuf_wire() -> None:
        pbcodec.decode_message(
            pbcodec.GrpsMessage.FromString(pbcodec.encode_message(payload).SerializeToString())
        )

    return {
        name: _time_ms(fn, budget_s)
        for name, fn in (
            ("json_ours_ms", ours),
            ("json_protobuf_ms", protobuf_json),
            ("grpc_wire_ms", protobuf_wire),
        )
    }


def _time_ms(fn: Any, budget_s: float) -> float:
    fn()
    times = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(times) < 3:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeats = 0.5, 1
    codec_runs: dict[str, list[dict[str, float]]] = {size: [] for size in SIZES}
    for _repeat in range(args.repeats):
        for size, nbytes in SIZES.items():
            codec_runs[size].append(codec_times(nbytes, 0.1 if args.quick else 0.4))
    sections = {
        # As make run sizes them: one process per 2 CPUs (HTTP) and 4 (gRPC), two at least.
        "http": {"workers": "auto", "threads": 8},
        "grpc": {"workers": "auto", "threads": 8},
        "shm": {"request_ring_bytes": 64 * MiB, "response_ring_bytes": 64 * MiB},
    }
    with running(demo_models("identity"), **sections) as appliance:
        runs = serve(appliance, args)
    summary = summarise(runs, codec_runs)
    report(summary, args.clients)
    write_results(
        RESULTS,
        clients=args.clients,
        seconds=args.seconds,
        repeats=args.repeats,
        summary=summary,
        runs=runs,
        codec_runs=codec_runs,
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


def serve(appliance: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run every serving measurement from ``args.clients`` processes, repeats outermost."""
    caller_args = (appliance.ports, str(appliance.run_dir))
    with ClientPool(args.clients, functools.partial(mode_call, Caller)) as pool:
        server = ProcessTree(appliance.process.pid)
        return mode_grid(pool, MODES, SIZES, caller_args, args.seconds, args.repeats, server)


def summarise(
    runs: dict[str, dict[str, list[dict[str, float]]]],
    codec_runs: dict[str, list[dict[str, float]]],
) -> dict[str, Any]:
    table = {
        mode: {size: median_row(rows) for size, rows in by_size.items()}
        for mode, by_size in runs.items()
    }
    codecs = {size: median_row(rows) for size, rows in codec_runs.items()}
    ratios = {
        size: {
            "grps_grpc_vs_kserve_grpc_rps": table["grpc"][size]["rps"]
            / table["kserve-grpc"][size]["rps"],
            "grps_rest_vs_grps_grpc_rps": table["rest-json"][size]["rps"]
            / table["grpc"][size]["rps"],
            "grps_grpc_vs_direct_rps": table["grpc"][size]["rps"] / table["direct"][size]["rps"],
            "json_codec_speedup_vs_protobuf_json": codecs[size]["json_protobuf_ms"]
            / codecs[size]["json_ours_ms"],
        }
        for size in SIZES
    }
    return {"by_mode": table, "codec_ms": codecs, "ratios": ratios}


def report(summary: dict[str, Any], clients: int) -> None:
    print(f"\nidentity, {clients} client processes, closed loop (medians over repeats)")
    print(f"{'mode':>11} {'size':>6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'MB/s':>8}")
    for mode, by_size in summary["by_mode"].items():
        for size, row in by_size.items():
            print(
                f"{mode:>11} {size:>6} {row['rps']:>9.0f} {row['p50_ms']:>8.3f} "
                f"{row['p99_ms']:>8.3f} {row['mbps']:>8.1f}"
            )
    print("\ncodec, ms per reply encode + request decode (one process):")
    print(f"{'size':>6} {'ours JSON':>10} {'protobuf JSON':>14} {'gRPC wire':>10}")
    for size, row in summary["codec_ms"].items():
        print(
            f"{size:>6} {row['json_ours_ms']:>10.3f} {row['json_protobuf_ms']:>14.3f} "
            f"{row['grpc_wire_ms']:>10.3f}"
        )
    print("\nratios, same run:")
    for size, row in summary["ratios"].items():
        text = ", ".join(f"{key} {value:.2f}" for key, value in row.items())
        print(f"  {size}: {text}")


if __name__ == "__main__":
    sys.exit(main())
