"""GraphPipe over HTTP against the internal client, and the reply codec against memcpy.

Round trips through the ``identity`` model (FP32 in, the same tensor out) at
64 B, 64 KiB, 1 MiB and 16 MiB, one request in flight, three ways:

- ``internal``: ``ModelClient.infer`` from this process, output copied out
  (the floor every protocol stands on);
- ``session``: a pre-encoded GraphPipe request POSTed on a keep-alive
  ``requests.Session``, the reply parsed by the stock client's decoder;
- ``stock``: ``graphpipe.remote.execute`` as a user calls it (it encodes,
  opens a new connection per call, and decodes).

And the codec alone at 16 MiB: building the InferResponse (one copy into the
builder, one out as bytes) against one ``bytes`` copy of the data, against
the generated API's ``CreateNumpyVector``, and decoding a 16 MiB request.

Each measurement is repeated; the table shows medians over repeats, and
bench/results/graphpipe.json holds every repeat. Usage::

    python bench/bench_graphpipe.py [--repeats N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from appliance._generated.graphpipe import InferResponse as fb_infer_response  # noqa: E402
from appliance._generated.graphpipe import Tensor as fb_tensor  # noqa: E402
from appliance.core.tensor import Tensor  # noqa: E402
from appliance.protocols.graphpipe import codec  # noqa: E402
from appliance.protocols.graphpipe.wire import new_builder  # noqa: E402
from bench.loadgen import tensor, thread_loop, write_results  # noqa: E402
from tests.system.harness import demo_models, running  # noqa: E402
from tests.unit.test_graphpipe_encoder import encode_infer_request  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "graphpipe.json"
MiB = 1 << 20
SIZES = {"64B": 64, "64KiB": 64 << 10, "1MiB": MiB, "16MiB": 16 * MiB}
COUNTS = {"64B": 400, "64KiB": 300, "1MiB": 100, "16MiB": 12}
CODEC_COUNT = 10


def median_us(call: Callable[[], object], count: int) -> float:
    """Median microseconds of ``count`` sequential calls, after one to warm up."""
    return thread_loop(lambda _index: call, count, 1, warmup=1)["p50_us"]


def round_trips(base: str, client: Any, quick: bool) -> dict[str, dict[str, float]]:
    from graphpipe import convert, remote

    url = f"{base}/graphpipe/identity"
    session = requests.Session()
    table: dict[str, dict[str, float]] = {}
    for size, nbytes in SIZES.items():
        x = tensor(nbytes)
        body = encode_infer_request([x])
        count = max(3, COUNTS[size] // (10 if quick else 1))

        def internal(x: Any = x) -> None:
            with client.infer("identity", {"INPUT0": x}) as result:
                result.array("OUTPUT0").copy()

        def posted(body: bytes = body, nbytes: int = x.nbytes) -> None:
            reply = session.post(url, data=body, timeout=60)
            outputs, _errors = convert.deserialize_infer_response(reply.content)
            assert outputs[0].nbytes == nbytes

        def stock(x: Any = x) -> None:
            remote.execute(url, x)

        table[size] = {
            "internal_us": median_us(internal, count),
            "session_us": median_us(posted, count),
            "stock_us": median_us(stock, count),
        }
    session.close()
    return table


def generated_reply(array: np.ndarray[Any, Any]) -> bytes:
    """Build the same reply through the generated API's CreateNumpyVector."""
    builder = new_builder(array.nbytes)
    fb_tensor.StartShapeVector(builder, array.ndim)
    for dim in reversed(array.shape):
        builder.PrependInt64(dim)
    shape = builder.EndVector()
    data = builder.CreateNumpyVector(array.reshape(-1).view(np.uint8))
    fb_tensor.Start(builder)
    fb_tensor.AddType(builder, 10)
    fb_tensor.AddShape(builder, shape)
    fb_tensor.AddData(builder, data)
    entry = fb_tensor.End(builder)
    fb_infer_response.StartOutputTensorsVector(builder, 1)
    builder.PrependUOffsetTRelative(entry)
    vector = builder.EndVector()
    fb_infer_response.Start(builder)
    fb_infer_response.AddOutputTensors(builder, vector)
    builder.Finish(fb_infer_response.End(builder))
    return bytes(builder.Output())


def codec_timings() -> dict[str, float]:
    x = tensor(SIZES["16MiB"])
    out = Tensor.from_array(x)
    body = encode_infer_request([x])

    def decode() -> None:
        request = codec.decode_request(body)
        assert isinstance(request, codec.InferRequest)
        codec.to_tensor(request.inputs[0], "x")

    return {
        "memcpy_us": median_us(lambda: bytes(x.data), CODEC_COUNT),
        "encode_reply_us": median_us(lambda: codec.encode_infer_response([out]), CODEC_COUNT),
        "generated_reply_us": median_us(lambda: generated_reply(x), CODEC_COUNT),
        "decode_request_us": median_us(decode, CODEC_COUNT),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer requests, for a smoke run")
    args = parser.parse_args()
    warnings.simplefilter("ignore", DeprecationWarning)  # graphpipe 1.0.4's EndVector(n)
    shm = {"request_ring_bytes": 96 * MiB, "response_ring_bytes": 96 * MiB}
    runs: dict[str, list[Any]] = {"round_trips": [], "codec": []}
    with running(demo_models("identity"), shm=shm, http={"workers": 1}) as appliance:
        base = f"http://127.0.0.1:{appliance.ports['http']}"
        client = appliance.client()
        for repeat in range(args.repeats):
            print(f"repeat {repeat + 1}/{args.repeats}", file=sys.stderr)
            runs["round_trips"].append(round_trips(base, client, args.quick))
            runs["codec"].append(codec_timings())
    summary = summarise(runs)
    report(summary)
    write_results(RESULTS, repeats=args.repeats, summary=summary, runs=runs)
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


def summarise(runs: dict[str, list[Any]]) -> dict[str, Any]:
    by_size = {}
    for size in SIZES:
        row = {
            key: statistics.median(run[size][key] for run in runs["round_trips"])
            for key in ("internal_us", "session_us", "stock_us")
        }
        row["session_x_internal"] = row["session_us"] / row["internal_us"]
        row["stock_x_internal"] = row["stock_us"] / row["internal_us"]
        by_size[size] = row
    codec_row = {
        key: statistics.median(run[key] for run in runs["codec"]) for key in runs["codec"][0]
    }
    codec_row["encode_reply_x_memcpy"] = codec_row["encode_reply_us"] / codec_row["memcpy_us"]
    codec_row["generated_x_ours"] = codec_row["generated_reply_us"] / codec_row["encode_reply_us"]
    return {"by_size": by_size, "codec_16MiB": codec_row}


def report(summary: dict[str, Any]) -> None:
    print("\nidentity round trips, 1 in flight, medians (us)")
    print(
        f"{'size':>6} {'internal':>10} {'session':>10} {'stock':>10} {'sess x':>7} {'stock x':>8}"
    )
    for size, row in summary["by_size"].items():
        print(
            f"{size:>6} {row['internal_us']:>10.1f} {row['session_us']:>10.1f} "
            f"{row['stock_us']:>10.1f} {row['session_x_internal']:>7.2f} "
            f"{row['stock_x_internal']:>8.2f}"
        )
    codec_row = summary["codec_16MiB"]
    print("\ncodec at 16 MiB, medians (us)")
    for key, value in codec_row.items():
        print(f"  {key}: {value:.2f}")


if __name__ == "__main__":
    sys.exit(main())
