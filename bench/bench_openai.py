"""OpenAI's routes on the demo models: streams' time to first token and tokens per second,
and embeddings over OpenAI's route against the same model over KServe.

The appliance serves ``appliance/demos/llm`` (tiny_gpt, tiny_embed).

- Streams: S streams at once (1 and 16), each a closed loop of
  ``POST /v1/completions`` with ``stream: true``, 32 tokens (seeded sampling),
  by the ``openai`` client's AsyncOpenAI in this process. Per stream: the time to
  its first text chunk, and its tokens per second after it; over the cell,
  the tokens of all streams per second and the server's CPU per token.
- Embeddings: ``POST /v1/embeddings`` with one text against KServe REST's
  ``/v2/models/tiny_embed/infer`` with the same text as a BYTES tensor, 1 and
  16 clients in closed loops (bench/loadgen.py's client processes): req/s,
  latency, server CPU per request.

Rounds interleave the cells; tables hold medians over rounds. Results go to
bench/results/openai.json. Usage::

    python bench/bench_openai.py [--seconds S] [--rounds R] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

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
from tests.system.harness import serving_repository  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "openai.json"
REPOSITORY = ROOT / "appliance" / "demos" / "llm"
STREAMS = (1, 16)
CLIENTS = (1, 16)
TOKENS = 32
TEXT = "Each model instance is a process of its own."
POOL = 4


# -- streams -----------------------------------------------------------------------------


async def one_stream(client: Any, seed: int) -> tuple[float, int, float]:
    """A stream's (seconds to its first text, tokens, seconds from then to its end)."""
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    stream = await client.completions.create(
        model="tiny_gpt", prompt="The model worker", max_tokens=TOKENS, stream=True, seed=seed
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            if not tokens:
                first = time.perf_counter() - started
            tokens += 1
    return first, tokens, time.perf_counter() - started - first


async def streams_cell(address: str, streams: int, seconds: float) -> dict[str, Any]:
    import openai

    firsts: list[float] = []
    rates: list[float] = []
    counted = [0]
    deadline = time.perf_counter() + seconds

    async def loop(client: Any, index: int) -> None:
        seed = index
        while time.perf_counter() < deadline:
            first, tokens, rest = await one_stream(client, seed)
            seed += streams
            firsts.append(first)
            counted[0] += tokens
            if tokens > 1 and rest > 0:
                rates.append((tokens - 1) / rest)

    started = time.perf_counter()
    client = openai.AsyncOpenAI(
        base_url=f"http://{address}/v1", api_key="-", max_retries=0, timeout=60
    )
    async with client:
        await asyncio.gather(*(loop(client, index) for index in range(streams)))
    wall = time.perf_counter() - started
    firsts.sort()
    return {
        "streams": streams,
        "completions": len(firsts),
        "ttft_p50_ms": statistics.median(firsts) * 1e3,
        "ttft_p90_ms": firsts[int(0.9 * (len(firsts) - 1))] * 1e3,
        "tokens_per_s_per_stream": statistics.median(rates) if rates else 0.0,
        "tokens_per_s": counted[0] / wall,
        "tokens": counted[0],
    }


def measure_streams(address: str, pid: int, streams: int, seconds: float) -> dict[str, Any]:
    tree = ProcessTree(pid)
    tree.refresh()
    before = tree.cpu_seconds()
    row = asyncio.run(streams_cell(address, streams, seconds))
    cpu_s = tree.cpu_seconds() - before
    row["server_cpu_us_per_token"] = cpu_s / max(1, row["tokens"]) * 1e6
    return row


# -- embeddings ---------------------------------------------------------------------------


def make_call(spec: dict[str, Any], shared: dict[str, Any]) -> Callable[[], None]:
    """One embedding over a keep-alive connection, by OpenAI's route or KServe's."""
    del shared
    import http.client

    host, port = spec["address"].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    if spec["route"] == "openai":
        path = "/v1/embeddings"
        body = orjson.dumps({"model": "tiny_embed", "input": TEXT, "encoding_format": "base64"})
    else:
        path = "/v2/models/tiny_embed/infer"
        tensor = {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [TEXT]}
        body = orjson.dumps({"inputs": [tensor]})
    headers = {"Content-Type": "application/json"}

    def call() -> None:
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise AssertionError(f"{answer.status}: {data[:200]!r}")

    return call


# -- the run ------------------------------------------------------------------------------


@contextlib.contextmanager
def appliance() -> Iterator[dict[str, Any]]:
    with serving_repository(REPOSITORY) as served:
        yield {"address": f"127.0.0.1:{served.ports['http']}", "pid": served.process.pid}


def run(args: argparse.Namespace) -> dict[str, Any]:
    stream_runs: dict[str, list[dict[str, Any]]] = {}
    embedding_runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with appliance() as served, ClientPool(POOL, make_call) as pool:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr)
            for streams in STREAMS:
                row = measure_streams(served["address"], served["pid"], streams, args.seconds)
                stream_runs.setdefault(f"{streams} streams", []).append(row)
            for clients in CLIENTS:
                for route in ("openai", "kserve"):
                    spec = {"address": served["address"], "route": route}
                    row = pool.measure(spec, clients, args.seconds, ProcessTree(served["pid"]))
                    if row["errors"]:
                        raise RuntimeError(f"embeddings {route} {clients}c: {row['error']}")
                    cell = f"embeddings {clients}c"
                    embedding_runs.setdefault(cell, {}).setdefault(route, []).append(row)
    streams_table = {
        cell: {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        for cell, rows in stream_runs.items()
    }
    embeddings_table = {
        cell: {route: median_row(rows) for route, rows in by_route.items()}
        for cell, by_route in embedding_runs.items()
    }
    return {
        "streams": streams_table,
        "embeddings": embeddings_table,
        "runs": {"streams": stream_runs, "embeddings": embedding_runs},
    }


def main() -> int:
    args = round_arguments(__doc__.split("\n")[0], 2.0)
    results = run(args)
    print("\nstreams of tiny_gpt (32 tokens each), medians over rounds")
    print(
        "| streams | TTFT p50 ms | TTFT p90 ms | tokens/s a stream | tokens/s in all "
        "| server CPU µs/token |"
    )
    print("|---|---|---|---|---|---|")
    for row in results["streams"].values():
        print(
            f"| {row['streams']:.0f} | {row['ttft_p50_ms']:.1f} | {row['ttft_p90_ms']:.1f} | "
            f"{row['tokens_per_s_per_stream']:.0f} | {row['tokens_per_s']:.0f} | "
            f"{row['server_cpu_us_per_token']:.0f} |"
        )
    print_cells(results["embeddings"])
    write_results(RESULTS, seconds=args.seconds, rounds=args.rounds, **results)
    print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
