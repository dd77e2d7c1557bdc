"""What real TorchServe 0.12.0 answers on the wire: regenerates
docs/models/torchserve-wire-facts.md.

    .venv/bin/python -m bench.torchserve_facts [OUT.md]

It builds a model store with tests/torchserve_models.py, serves it with
bench/torchserve_peer.py (four starts: the defaults; Prometheus metrics; the
``kserve`` and ``kservev2`` envelopes), and makes every call over a raw
socket: the request is the bytes sent, the response the bytes received (the
status line, headers as sent, chunks with their arrival times). Ports are
shown as TorchServe's defaults (8080 inference, 8081 management, 8082
metrics); request ids, dates and times change from run to run.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.servers import PeerServer, PeerUnavailable
from bench.torchserve_calls import CHECKS, ENVELOPES, INFERENCE, MANAGEMENT, Seen
from bench.torchserve_peer import VERSION, leftovers, torchserve, torchserve_bin
from bench.torchserve_wire import Exchange, Recorder, concurrently, exchange, multipart
from tests import torchserve_models as tm

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "models" / "torchserve-wire-facts.md"


def write_store(folder: Path, python: str) -> list[str]:
    """The archives of every run; returns the ``--models`` of the first."""
    tm.write_mar(folder, "echo", tm.ECHO_HANDLER)
    tm.write_model_dir(folder, "echo_dir", tm.ECHO_HANDLER)
    tm.write_mar(folder, "inspect", tm.INSPECT_HANDLER)
    labels = {"labels.json": json.dumps(tm.LABELS)}
    tm.write_mar(folder, "labels", tm.LABELS_HANDLER, extra_files=labels)
    tm.write_mar(
        folder,
        "labels",
        tm.LABELS_HANDLER,
        extra_files=labels,
        version="2.0",
        mar_name="labels_v2.mar",
    )
    tm.write_mar(folder, "wrong", tm.WRONG_LENGTH_HANDLER)
    tm.write_mar(folder, "broken", tm.BROKEN_HANDLER)
    tm.write_mar(folder, "raising", tm.RAISING_HANDLER)
    tm.write_mar(folder, "stream", tm.STREAM_HANDLER)
    tm.write_mar(folder, "metrics", tm.METRICS_HANDLER)
    tm.write_mar(folder, "batch", tm.BATCH_HANDLER, config_yaml=tm.BATCH_CONFIG)
    weights = tm.mnist_state_dict(folder / "mnist_cnn.pt", python=python)
    tm.write_mar(
        folder,
        "mnist",
        tm.MNIST_HANDLER,
        model_file=("mnist.py", tm.MNIST_MODEL),
        serialized_file=weights,
        handler_file="mnist_handler.py",
    )
    weights.unlink()
    names = ["echo", "inspect", "labels", "wrong", "raising", "stream", "metrics", "batch"]
    return [f"{n}.mar" for n in names] + ["echo_dir", "mnist.mar"]


def bodies() -> dict[str, tuple[str, bytes]]:
    """The bodies the scripts name: @png, @form, @mixed, @pngform (content type, bytes)."""
    png = tm.digit_png()
    form_type, form = multipart(
        [("data", "a.txt", "text/plain", b"file text"), ("meta", None, None, b'{"k": 1}')]
    )
    png_type, png_form = multipart([("data", "digit.png", "image/png", png)])
    return {
        "@png": ("image/png", png),
        "@form": (form_type, form),
        "@mixed": (form_type.replace("form-data", "mixed"), form),
        "@pngform": (png_type, png_form),
    }


def batching(rec: Recorder) -> Seen:
    """Four concurrent requests to the batch-4 model, then one alone."""
    base = rec.urls["inference"]
    text = {"Content-Type": "text/plain"}
    rec.text("### Batching: 4 concurrent requests to `batch` (batchSize 4, maxBatchDelay 200)", "")

    def one(body: str) -> Callable[[], Exchange]:
        return lambda: exchange(base, "POST", "/predictions/batch", body=body, headers=text)

    rounds = []
    for round_ in range(2):
        rounds.append(concurrently([one(str(i)) for i in range(4)]))
        for i, done in enumerate(rounds[-1]):
            rec.text(f"- round {round_}, request {i}: {done.status}, {done.seconds * 1000:.0f} ms,")
            rec.text(f"  `{done.body!r}`")
    alone = one("alone")()
    rec.text(f"- one alone: {alone.status}, {alone.seconds * 1000:.0f} ms, `{alone.body!r}`", "")
    return {"batch_round": rounds[-1], "batch_alone": alone}


def _grep(pattern: str, count: int) -> Callable[[list[str]], list[str]]:
    return lambda lines: [ln for ln in lines if re.search(pattern, ln)][:count]


def _one_per_metric(lines: list[str]) -> list[str]:
    """The first line of each metric name (``... - Name.Unit:value|#dims|#...``)."""
    firsts: dict[str, str] = {}
    for line in lines:
        name = line.split(" - ", 1)[-1].split(":", 1)[0]
        firsts.setdefault(name, line)
    return list(firsts.values())


def _before(marker: str, count: int) -> Callable[[list[str]], list[str]]:
    """The ``count`` lines up to the first with ``marker`` (one request's path through)."""

    def pick(lines: list[str]) -> list[str]:
        at = next((i for i, ln in enumerate(lines) if marker in ln), len(lines))
        return lines[max(0, at - count + 1) : at + 1]

    return pick


LOG_PICKS: dict[str, Callable[[list[str]], list[str]]] = {
    "access_log.log": _grep(r"/predictions/|/explanations/| /models\?url", 14),
    "model_log.log": _grep(
        r"initialized|about to raise|logged with|[a-z](Error|Exception): |mismatch|Invalid|WARN", 30
    ),
    "ts_log.log": _before("POST /predictions/echo", 14),
    "model_metrics.log": _one_per_metric,
    "ts_metrics.log": _one_per_metric,
}


def log_lines(rec: Recorder, server: PeerServer) -> Seen:
    """Samples of each log file and of the console; returns the lines the notes check."""
    logs = Path(server.details["logs"])
    rec.text("## Logs", "", f"Files in the log folder: {sorted(p.name for p in logs.iterdir())}.")
    rec.text("The console (stdout) has every line in ts_log.log's format.", "")
    seen: Seen = {"console": server.log.read_text(errors="replace")}
    for name, pick in LOG_PICKS.items():
        path = logs / name
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        seen[name.replace(".log", "_lines")] = lines
        rec.text(f"### {name} ({len(lines)} lines; a sample)", "")
        rec.text("```text", *pick(lines), "```", "")
    return seen


def metrics_run(rec: Recorder, store: Path) -> Exchange:
    """A start in Prometheus mode with auto-detected model metrics."""
    props = {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"}
    with torchserve(store, ["echo.mar", "metrics.mar"], props) as server:
        rec.serve(server)
        rec.text(
            "## Metrics API (8082), metrics_mode=prometheus",
            "",
            f"Properties: `{props}`; two calls to `metrics`, one to `echo`, one 404.",
            "",
        )
        text = {"Content-Type": "text/plain"}
        for path in (
            "/predictions/metrics",
            "/predictions/metrics",
            "/predictions/echo",
            "/predictions/nope",
        ):
            exchange(server.urls["inference"], "POST", path, body="1", headers=text)
        time.sleep(1.0)
        done = rec.call("GET /metrics", "metrics", "GET", "/metrics", limit=30000)
        rec.call(
            "GET /metrics?name[]=...",
            "metrics",
            "GET",
            "/metrics?name[]=ts_inference_requests_total&name[]=HandleCallCount",
        )
        types = sorted(
            {(m[1], m[2]) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", done.body.decode(), re.M)}
        )
        rec.text("Metric names and types:", "", *(f"- `{n}`: {t}" for n, t in types), "")
        return done


def envelope_runs(rec: Recorder, store: Path) -> dict[str, Exchange]:
    """``service_envelope`` kserve and kservev2: what the echo handler gets of KServe bodies."""
    seen: dict[str, Exchange] = {}
    for envelope, script in ENVELOPES.items():
        rec.text(f"## service_envelope={envelope}", "")
        rec.text("The echo handler: each element it is given comes back.", "")
        try:
            with torchserve(store, ["echo.mar"], {"service_envelope": envelope}) as server:
                rec.serve(server)
                seen |= rec.script(script, "inference", {})
        except PeerUnavailable as error:
            rec.text("It did not start:", "", "```text", *str(error).splitlines()[:12], "```", "")
    return seen


# The surprises: "key: text" paragraphs; CHECKS[key] tells whether this run agrees.
NOTES = r"""
reason: Answers a handler made have an empty reason phrase (`HTTP/1.1 200 `, with the space)
and no Content-Type unless the handler sets one; answers TorchServe makes itself (errors,
/ping, the management API) have a phrase and `content-type: application/json`.

request_id: Every answer has `x-request-id`, a fresh UUID, which is also the handler's
`context.get_request_id(i)`; a client's own `X-Request-Id` is ignored (the handler sees it
among the request headers). Every answer also has `Pragma`, `Cache-Control` and `Expires`.

close: Every error answer says `connection: close` (TorchServe closes the connection after
it); successes say `keep-alive`.

methods: `/predictions/{m}` runs the handler whatever the method: GET (an empty bytearray
body), PUT (`curl -T`), DELETE all answer 200.

continue: `Expect: 100-continue` is answered `HTTP/1.1 100 Continue` first.

decoding: The handler gets a body as a decoded JSON object only when the media type is
`application/json` (a charset parameter is fine), as `str` for `text/*`, else as
`bytearray` (no Content-Type included). Malformed JSON arrives as `bytearray` with a 200 (the
worker logs the JSONDecodeError).

form: `application/x-www-form-urlencoded` (what `curl -d` sends) is parsed: each field is a
key of the handler's request dict (`bytearray` values) and there is no `body`.

multipart: multipart/form-data gives one key per field: a part with a `text/*` Content-Type
arrives as `str`, one without as `bytearray`; multipart/mixed is not parsed (one `body`).

handler_headers: The handler's header names keep the client's case
(`context.get_request_header(i, "x-tag")` is None when the client sent `X-Tag`). TorchServe
adds `explain` ("False", "True" on /explanations), `url_path` (the path after the version,
on /predictions and /explanations only) and `{input name: {"content-type": ...}}` per input.

not_found: A wrong version is 404 `ModelVersionNotFoundException`, an unknown model 404
`ModelNotFoundException` ("Model not found: nope"), `/predictions` alone 404
`ResourceNotFoundException`: all as `{"code", "type", "message"}`.

errors: Any exception in the handler is 503 `InternalServerException` "Prediction failed";
`PredictionException(message, 418)` is a 418 with Netty's phrase ("Client Error (418)"),
its message, and still the type `InternalServerException`. One answer too many: 503 "number
of batch response mismatched"; an answer json.dumps refuses: 503 "Unsupported model output
data type.".

status: `context.set_response_status(code, phrase)` sets the status line (`201 Custom
Phrase`, `404 Custom Phrase`) and the handler's body still goes out as it is;
`context.set_response_header` becomes an HTTP header.

stream: A streamed answer is chunked and carries TorchServe's internal `ts_stream_next:
true` header; each `send_intermediate_predict_response` is one chunk, sent when the handler
sends it (0.3 s apart here), the handler's return value the last.

explain: /explanations runs the same handler with `explain: "True"`; BaseHandler's
explain path without an explanation method (`get_insights`) is a 503.

kserve_paths: Without an envelope `/v1/models/{m}:predict`, `:explain` and
`/v2/models/{m}/infer` are /predictions under other names (the body passes through as it
is). `GET /v1/models/{m}` is 404 on 8080 but KServe v1 readiness `{"name", "ready"}` on
8081; `/v2/models/{m}` (metadata) and `/v2/health/*` are not served; /ping is not on 8081.

aliases: `/invocations?model_name=`, `/models/{m}/invoke` and `/{m}/predict` are
/predictions too.

batching: Four concurrent requests to the batch-4 model are one batch (each saw 4) and
come back without waiting for maxBatchDelay; one alone waits it out (about 200 ms).
`context.system_properties["batch_size"]` is the configured 4 either way.

list: GET /models is sorted by name; `limit` pages it with `nextPageToken`, a string (the
offset of the next page), absent when nothing follows.

describe: GET /models/{m} is a list (one element per version asked for); with
`?customized=true` the worker answers (empty reason phrase) and `customizedMetadata` is added.

register: A synchronous registration answers 200 when the worker is up; the same archive
again 409 `ConflictStatusException`; a missing archive 404; no url 400. A second version
registered does not become the default.

broken: Registering a model whose handler cannot load: 500 "Failed to start workers for
model broken version: 1.0", yet the model stays registered with `minWorkers` and
`maxWorkers` 0 and no workers, and /ping still says Healthy.

scale: `PUT /models/{m}?min_worker=2&synchronous=true` answers 200 once scaled and raises
`maxWorkers` to 2 as well; without `synchronous` it is 202 "Processing worker updates...".

versions: Deleting the default version is 403 `InvalidModelVersionException`; deleting
another answers `Model "labels" unregistered` (no version named).

metrics_log: In the default metrics mode (log) the metrics port answers /metrics 200 with an
empty body, and a handler's own metrics that metrics.yaml does not name (`HandleCallCount`)
are not logged at all.

metrics_prom: With `metrics_mode=prometheus` and `model_metrics_auto_detect=true`, /metrics
has the frontend's `ts_*` counters, host gauges, `Requests2XX/4XX/5XX`, `QueueTime`,
`WorkerLoadTime`, `PredictionTime` and the handler's own metrics with labels `ModelName`,
`Level`, `Hostname` (each label set ends with a comma: `{...,}`); a HISTOGRAM gets
Prometheus's default buckets (0.005 to 10, so 50 % lands in +Inf).

logs: Every line of the `org.pytorch.serve` loggers is written twice to ts_log.log (its own
appender and the root's); the access, model-log and metric lines are in ts_log.log and on the
console as well. A handler's print is a MODEL_LOG INFO line from thread
`W-<port>-<model>_<version>-stdout`, and so is its `logging.warning` (the level is lost: the
worker logs to stdout); its stderr gives WARN lines from `...-stderr`.

kserve_envelope: `service_envelope=kserve` applies to every path, /predictions included:
the handler gets the `instances` elements, the answer is `{"predictions": [...]}`
(`{"explanations": [...]}` on :explain); a text body is a 503.

kservev2_envelope: `service_envelope=kservev2` applies to /predictions too: the handler
gets the `inputs` (BYTES data unwrapped), the answer is a V2 response whose `id` is the
request's or else TorchServe's request id; a text body is a 503.
"""


HEADER = """# TorchServe {version} on the wire

What real TorchServe {version} (pip's `torchserve`, Java 17, CPU torch) answers, call
by call, recorded by `bench/torchserve_facts.py` (regenerate: `.venv/bin/python -m
bench.torchserve_facts`). Requests are the bytes sent and answers the bytes received;
ports are shown as TorchServe's defaults (8080 inference, 8081 management, 8082
metrics); request ids, dates, times, PIDs and durations change from run to run. The
models are tests/torchserve_models.py's handlers (`echo`, `inspect`, `labels`,
`wrong`, `raising`, `stream`, `metrics`, `batch`, `mnist`), one worker each,
started as bench/torchserve_peer.py starts TorchServe: `--foreground --ncs
--disable-token-auth --enable-model-api`, a config.properties of its own. In the
bodies shown, CRLF line ends appear as line breaks; bytes that are not UTF-8 are shown
as a Python bytes literal.

Two things about the environment, found on the way: `pip install torchserve` brings no
numpy, which its KServe envelopes import (`service_envelope=kserve` or `kservev2` fails
every worker start with `ModuleNotFoundError: No module named 'numpy'`), so the peer
installs it; and torchvision's wheel from the index (0.28.0, the release for torch 2.13)
does not load beside the CPU torch ("operator torchvision::nms does not exist"), so
TorchServe's vision handlers (`ImageClassifier`, which pytorch/serve's mnist example
extends) cannot be imported here: the mnist handler does its preprocessing by hand.
"""


def notes(seen: Seen) -> list[str]:
    """NOTES, each checked against this run: one the run contradicts says so."""
    out = ["## Surprises (each checked against this run)", ""]
    for paragraph in NOTES.strip().split("\n\n"):
        key, _, text = paragraph.partition(": ")
        try:
            held = CHECKS[key](seen)
        except (KeyError, ValueError, IndexError, AttributeError, TypeError):
            held = False
        lines = text.splitlines()
        lines[-1] += "" if held else " **(NOT what this run saw.)**"
        out += [f"- {lines[0]}", *(f"  {line}" for line in lines[1:])]
    return [*out, ""]


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    # SIGTERM unwinds like Ctrl-C, so every started peer is stopped by its block.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    python = str(torchserve_bin() / "python")
    rec = Recorder()
    with tempfile.TemporaryDirectory(prefix="ts-facts-") as where:
        store = Path(where)
        models = write_store(store, python)
        with torchserve(store, models) as server:
            rec.serve(server)
            named = bodies()
            rec.text("## Inference API (8080)", "")
            seen = rec.script(INFERENCE, "inference", named)
            seen |= batching(rec)
            rec.text("## Management API (8081)", "")
            seen |= rec.script(MANAGEMENT, "management", named)
            rec.text("## Metrics API (8082), default metrics_mode (log)", "")
            seen["metrics_log"] = rec.call("GET /metrics", "metrics", "GET", "/metrics")
            seen |= log_lines(rec, server)
        seen["metrics_prom"] = metrics_run(rec, store)
        seen |= envelope_runs(rec, store)
    left = sorted({pid for server in rec.servers for pid in leftovers(server)})
    gone = all(not Path(s.details["tmpdir"]).exists() for s in rec.servers)
    rec.text(
        "## After each stop",
        "",
        f"Processes left: {left or 'none'}; private TMPDIRs removed: {gone}.",
        "",
    )
    out.write_text(
        HEADER.format(version=VERSION)
        + "\n"
        + "\n".join([*notes(seen), *rec.lines]).rstrip()
        + "\n"
    )
    print(f"wrote {out}; processes left: {left}")
    return 1 if left or not gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
