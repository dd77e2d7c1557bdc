"""The calls bench/torchserve_facts.py makes to TorchServe, and what it expects of them.

Each script is read by :meth:`bench.torchserve_wire.Recorder.script`; the
``=key`` of a call names it for :data:`NOTES`, whose checks run against every
regeneration (a note the run contradicts is marked so in the facts file).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

# What the run saw: Exchanges by their =key, and a few lists of log lines.
Seen = dict[str, Any]

# The calls, as Recorder.script reads them: "title :: METHOD path [@api] [=key]", then
# indented "H name: value" (a header), "B body" (Python escapes; @png, @form, @mixed,
# @pngform for the bodies made here), "N note", "E" (wait for 100 Continue first).
INFERENCE = r"""
GET /ping :: GET /ping =ping
  F
JSON body :: POST /predictions/echo =json
  H Content-Type: application/json
  B {"a": [1, 2], "b": "x"}
JSON body, what the handler sees :: POST /predictions/inspect =inspect_json
  H Content-Type: application/json
  B {"a": [1, 2]}
JSON with a charset :: POST /predictions/inspect =charset
  H Content-Type: application/json; charset=utf-8
  B {"a": 1}
Malformed JSON :: POST /predictions/inspect =malformed
  H Content-Type: application/json
  B {nope
text/plain body :: POST /predictions/echo =text
  H Content-Type: text/plain
  B hello world
application/octet-stream body :: POST /predictions/echo =octet
  H Content-Type: application/octet-stream
  B \x00\x01\x02\xff
No Content-Type :: POST /predictions/inspect =no_type
  B raw bytes
curl -d: application/x-www-form-urlencoded :: POST /predictions/inspect =form
  H Content-Type: application/x-www-form-urlencoded
  B a=1&b=two
  N What `curl -d 'a=1&b=two'` sends.
curl -T: PUT :: PUT /predictions/echo =put
  H User-Agent: curl/8.5.0
  H Accept: */*
  B uploaded file\n
  N `curl -T file URL` sends PUT, with no Content-Type.
PUT with Expect: 100-continue :: PUT /predictions/echo =continue
  H User-Agent: curl/8.5.0
  H Expect: 100-continue
  B big upload\n
  E
  N curl adds `Expect: 100-continue` to large uploads; the interim answer comes first.
GET on /predictions :: GET /predictions/inspect =get
DELETE on /predictions :: DELETE /predictions/echo =delete_pred
multipart/form-data: a file field, a plain field (inspect) :: POST /predictions/inspect =multipart
  H Content-Type: @form
  B @form
multipart/form-data, the same (echo) :: POST /predictions/echo =multipart_echo
  H Content-Type: @form
  B @form
multipart/mixed: not a form, so one `body` of bytes :: POST /predictions/inspect =mixed
  H Content-Type: @mixed
  B @form
Headers, segments after the version, a query :: POST /predictions/inspect/1.0/a/b?q=1 =headers
  H Content-Type: text/plain
  H X-Request-Id: my-own-id
  H X-Tag: t1
  B x
Right version :: POST /predictions/labels/1.0 =right_version
  H Content-Type: text/plain
  H X-Tag: t
  B 1
Wrong version :: POST /predictions/labels/9.9 =bad_version
  H Content-Type: text/plain
  B 1
Unknown model :: POST /predictions/nope =unknown
  B 1
No model name :: POST /predictions =no_name
  B 1
Handler raises ValueError :: POST /predictions/raising =raise
  B 1
Handler raises PredictionException("told to fail", 418) :: POST /predictions/raising =raise418
  H X-Raise: prediction
  B 1
Handler returns one answer too many :: POST /predictions/wrong =wrong
  B 1
Handler returns what json.dumps cannot take :: POST /predictions/echo =undumpable
  H X-Return: raw
  B 1
  N The echo handler returns the request's dict, whose body is a bytearray.
context.set_response_status(201, "Custom Phrase") and a header :: POST /predictions/labels =status
  H Content-Type: text/plain
  H X-Want-Status: 201
  B 2
context.set_response_status(404, "Custom Phrase") :: POST /predictions/labels =status404
  H Content-Type: text/plain
  H X-Want-Status: 404
  B 0
Streaming (send_intermediate_predict_response) :: POST /predictions/stream =stream
  B 1
  N The handler sends three parts 0.3 s apart, then returns its last.
/explanations on a function handler :: POST /explanations/inspect =explain
  H Content-Type: text/plain
  B 1
/explanations on BaseHandler (mnist) :: POST /explanations/mnist =explain_mnist
  H Content-Type: image/png
  B @png
KServe v1 path, no envelope :: POST /v1/models/inspect:predict =kfv1
  H Content-Type: application/json
  B {"instances": [1, 2]}
KServe v2 path, no envelope :: POST /v2/models/inspect/infer =kfv2
  H Content-Type: application/json
  B {"inputs": []}
KServe v1 explain path :: POST /v1/models/inspect:explain
  H Content-Type: application/json
  B {"instances": [1]}
GET /v1/models/{m} on 8080 :: GET /v1/models/echo =kfv1_get
GET /v2/models/{m} on 8080 :: GET /v2/models/echo =kfv2_get
GET /v2/health/ready on 8080 :: GET /v2/health/ready
SageMaker's /invocations :: POST /invocations?model_name=echo =invocations
  H Content-Type: text/plain
  B inv
/models/{m}/invoke on 8080 :: POST /models/echo/invoke =invoke
  H Content-Type: text/plain
  B inv
Legacy /{m}/predict :: POST /echo/predict =legacy
  H Content-Type: text/plain
  B legacy
An unpacked model folder (echo_dir) :: POST /predictions/echo_dir =echo_dir
  H Content-Type: text/plain
  B from a folder
mnist (BaseHandler, eager torch): a PNG as the raw body :: POST /predictions/mnist =mnist
  H Content-Type: image/png
  B @png
mnist: the PNG as multipart field `data` :: POST /predictions/mnist =mnist_form
  H Content-Type: @pngform
  B @pngform
Custom metrics (logged in the default metrics mode?) :: POST /predictions/metrics =metrics_call
  B 1
GET /models on 8080 :: GET /models =models_8080
GET /metrics on 8080 :: GET /metrics
GET /api-description (cut) :: GET /api-description
"""

MANAGEMENT = r"""
GET /models :: GET /models =list
GET /models?limit=2 :: GET /models?limit=2 =page
The next page :: GET /models?limit=2&next_page_token=2 =page2
GET /models/{m} :: GET /models/echo =describe
GET /models/{m} of the batch-4 model :: GET /models/batch
GET /models/{m}?customized=true :: GET /models/echo?customized=true =customized
GET /models/{m}/{v} :: GET /models/labels/1.0
Register, synchronous :: POST /models?url=labels_v2.mar&initial_workers=1&synchronous=true =register
  N labels_v2.mar holds version 2.0 of `labels`.
Register it again :: POST /models?url=labels_v2.mar&initial_workers=1&synchronous=true =again
Register an archive that is not there :: POST /models?url=missing.mar =missing
Register without url :: POST /models =no_url
Register a broken model :: POST /models?url=broken.mar&initial_workers=1&synchronous=true =broken
  T 90
GET /ping while `broken` has no worker :: GET /ping @inference =ping_broken
GET /models/broken :: GET /models/broken =broken_model
DELETE /models/broken :: DELETE /models/broken
GET /models/{m}/all :: GET /models/labels/all =all
Inference after registering 2.0 :: POST /predictions/labels @inference =after_register
  H Content-Type: text/plain
  B 1
Scale, synchronous :: PUT /models/echo?min_worker=2&synchronous=true =scale
GET /models/{m} after scaling :: GET /models/echo =scaled
Scale, asynchronous :: PUT /models/echo?min_worker=1&max_worker=1 =scale_async
PUT /models/{m}/{v}/set-default :: PUT /models/labels/2.0/set-default =set_default
Inference after set-default :: POST /predictions/labels @inference =after_default
  H Content-Type: text/plain
  B 1
set-default to a version that is not there :: PUT /models/labels/9.9/set-default
DELETE the default version :: DELETE /models/labels/2.0 =delete_default
DELETE /models/{m}/{v}, not the default :: DELETE /models/labels/1.0 =delete
GET /models/{m}/all after :: GET /models/labels/all
GET /models/{unknown} :: GET /models/nope =unknown_model
GET /models/{m}/{unknown version} :: GET /models/echo/9.9
PUT /models/{unknown}?min_worker=1 :: PUT /models/nope?min_worker=1
DELETE /models/{unknown} :: DELETE /models/nope
DELETE /models :: DELETE /models
GET /v1/models/{m} on 8081 (KServe v1 readiness) :: GET /v1/models/echo =kfv1_ready
GET /ping on 8081 :: GET /ping =ping_8081
"""


ENVELOPES = {
    "kserve": r"""
KServe v1 predict :: POST /v1/models/echo:predict =env_v1
  F
  H Content-Type: application/json
  B {"instances": [{"data": 1}, {"data": "two"}]}
The same body on /predictions :: POST /predictions/echo =env_v1_pred
  H Content-Type: application/json
  B {"instances": [{"data": 1}, {"data": "two"}]}
KServe v1 explain :: POST /v1/models/echo:explain =env_v1_explain
  H Content-Type: application/json
  B {"instances": [{"data": 1}]}
A plain text body :: POST /v1/models/echo:predict =env_v1_text
  H Content-Type: text/plain
  B hello
""",
    "kservev2": r"""
KServe v2 infer, INT64 :: POST /v2/models/echo/infer =env_v2
  F
  H Content-Type: application/json
  B {"id": "r1", "inputs": [{"name": "in0", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}
KServe v2 infer, BYTES :: POST /v2/models/echo/infer =env_v2_bytes
  H Content-Type: application/json
  B {"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
The INT64 body on /predictions :: POST /predictions/echo =env_v2_pred
  H Content-Type: application/json
  B {"id": "r1", "inputs": [{"name": "in0", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}
A plain text body :: POST /v2/models/echo/infer =env_v2_text
  H Content-Type: text/plain
  B hello
""",
}


def _in(s: Seen, key: str, *texts: str) -> bool:
    return all(text.encode() in s[key].body for text in texts)


def _exchange(value: Any) -> bool:
    return hasattr(value, "headers") and bool(value.status.startswith("HTTP/"))


def _gaps(chunks: list[tuple[float, bytes]]) -> list[float]:
    return [b[0] - a[0] for a, b in itertools.pairwise(chunks)]


def _twice(lines: list[str]) -> bool:
    pairs = itertools.pairwise(lines)
    return any(a == b and "org.pytorch.serve" in a for a, b in pairs)


CHECKS: dict[str, Callable[[Seen], bool]] = {
    "reason": lambda s: (
        s["json"].status == "HTTP/1.1 200 "
        and s["json"].header("content-type") is None
        and s["unknown"].status == "HTTP/1.1 404 Not Found"
        and s["unknown"].header("content-type") == "application/json"
    ),
    "request_id": lambda s: (
        all(x.header("x-request-id") and x.header("Expires") for x in s.values() if _exchange(x))
        and s["headers"].header("x-request-id") != "my-own-id"
        and _in(s, "headers", '"X-Request-Id": "my-own-id"')
        and _in(s, "inspect_json", s["inspect_json"].header("x-request-id"))
        and s["ping"].header("Pragma") == "no-cache"
    ),
    "close": lambda s: (
        s["json"].header("connection") == "keep-alive"
        and all(s[k].header("connection") == "close" for k in ("unknown", "raise", "wrong"))
    ),
    "methods": lambda s: (
        all(s[k].code == 200 for k in ("get", "put", "delete_pred"))
        and _in(s, "get", '"body": {"text": "", "type": "bytearray"}')
    ),
    "continue": lambda s: s["continue"].interim == ["HTTP/1.1 100 Continue"],
    "decoding": lambda s: (
        _in(s, "inspect_json", '"type": "dict"')
        and _in(s, "charset", '"type": "dict"')
        and _in(s, "malformed", '"type": "bytearray"')
        and s["malformed"].code == 200
        and _in(s, "no_type", '"type": "bytearray"')
        and _in(s, "headers", '"type": "str"')
    ),
    "form": lambda s: (
        _in(s, "form", '"a": {"text": "1"', '"b": {"text": "two"') and not _in(s, "form", '"body"')
    ),
    "multipart": lambda s: (
        _in(s, "multipart", '"data": {"type": "str"', '"meta": {"text"')
        and _in(s, "mixed", '"body": {"text": "------')
    ),
    "handler_headers": lambda s: (
        _in(
            s,
            "right_version",
            "\"get_request_header(i, 'x-tag')\": null",
            '"get_request_header(i, \'X-Tag\')": "t"',
        )
        and _in(s, "headers", '"url_path": "a/b"')
        and _in(s, "explain", '"explain": "True"')
        and _in(s, "inspect_json", '"body": {"content-type": "application/json"}')
        and not _in(s, "kfv1", "url_path")
    ),
    "not_found": lambda s: (
        s["bad_version"].code == s["unknown"].code == s["no_name"].code == 404
        and _in(s, "bad_version", "ModelVersionNotFoundException")
        and _in(s, "unknown", "ModelNotFoundException", "Model not found: nope")
        and _in(s, "no_name", "ResourceNotFoundException")
    ),
    "errors": lambda s: (
        s["raise"].code == 503
        and _in(s, "raise", '"Prediction failed"')
        and s["raise418"].status == "HTTP/1.1 418 Client Error (418)"
        and _in(s, "raise418", '"told to fail"', "InternalServerException")
        and s["wrong"].code == s["undumpable"].code == 503
        and _in(s, "wrong", "number of batch response mismatched")
        and _in(s, "undumpable", "Unsupported model output data type.")
    ),
    "status": lambda s: (
        s["status"].status == "HTTP/1.1 201 Custom Phrase"
        and s["status404"].status == "HTTP/1.1 404 Custom Phrase"
        and _in(s, "status404", '"label": "zero"')
        and s["status"].header("x-labels") == "3"
    ),
    "stream": lambda s: (
        s["stream"].header("transfer-encoding") == "chunked"
        and s["stream"].header("ts_stream_next") == "true"
        and [c for _, c in s["stream"].chunks] == [b"part0 ", b"part1 ", b"part2 ", b"last"]
        and all(gap > 0.2 for gap in _gaps(s["stream"].chunks))
    ),
    "explain": lambda s: _in(s, "explain", '"explain": "True"') and s["explain_mnist"].code == 503,
    "kserve_paths": lambda s: (
        s["kfv1"].code == s["kfv2"].code == 200
        and _in(s, "kfv1", '"instances": [1, 2]')
        and s["kfv1_get"].code == s["kfv2_get"].code == s["ping_8081"].code == 404
        and s["kfv1_ready"].json() == {"name": "echo", "ready": True}
    ),
    "aliases": lambda s: all(s[k].code == 200 for k in ("invocations", "invoke", "legacy")),
    "batching": lambda s: (
        all(json.loads(d.body)["batch"] == 4 for d in s["batch_round"])
        and json.loads(s["batch_alone"].body) == {"batch": 1, "index": 0, "batch_size": 4}
        and s["batch_alone"].seconds >= 0.2 > max(d.seconds for d in s["batch_round"])
    ),
    "list": lambda s: (
        (names := [m["modelName"] for m in s["list"].json()["models"]]) == sorted(names)
        and "nextPageToken" not in s["list"].json()
        and s["page"].json()["nextPageToken"] == "2"
    ),
    "describe": lambda s: (
        isinstance(s["describe"].json(), list)
        and s["customized"].status == "HTTP/1.1 200 "
        and "customizedMetadata" in s["customized"].json()[0]
    ),
    "register": lambda s: (
        s["register"].code == 200
        and (s["again"].code, s["missing"].code, s["no_url"].code) == (409, 404, 400)
        and _in(s, "after_register", '"version": "1.0"')
    ),
    "broken": lambda s: (
        s["broken"].code == 500
        and _in(s, "broken", "Failed to start workers for model broken version: 1.0")
        and (m := s["broken_model"].json()[0])["minWorkers"] == m["maxWorkers"] == 0
        and m["workers"] == []
        and _in(s, "ping_broken", '"Healthy"')
    ),
    "scale": lambda s: (
        s["scale"].code == 200
        and s["scaled"].json()[0]["maxWorkers"] == 2
        and s["scale_async"].code == 202
    ),
    "versions": lambda s: (
        s["delete_default"].code == 403
        and _in(s, "delete_default", "InvalidModelVersionException")
        and _in(s, "delete", 'Model \\"labels\\" unregistered')
    ),
    "metrics_log": lambda s: (
        s["metrics_log"].code == 200
        and s["metrics_log"].body == b""
        and s["metrics_call"].code == 200
        and not any("HandleCallCount" in line for line in s["model_metrics_lines"])
    ),
    "metrics_prom": lambda s: all(
        re.search(pattern, s["metrics_prom"].body.decode())
        for pattern in (
            r'ts_inference_requests_total\{model_name="metrics",model_version="default",',
            r'HandleCallCount\{ModelName="metrics",Level="Model",Hostname="[^"]*",\} 2\.0',
            r'SomePercent_bucket\{[^}]*le="10\.0",\} 0\.0',
            r'SomePercent_bucket\{[^}]*le="\+Inf",\} 2\.0',
            r"# TYPE QueueTime gauge",
            r"WorkerLoadTime\{WorkerName=",
        )
    ),
    "logs": lambda s: (
        _twice(s["ts_log_lines"])
        and all(
            any(f" {name} - " in line for line in s["ts_log_lines"])
            for name in ("ACCESS_LOG", "MODEL_LOG", "TS_METRICS", "MODEL_METRICS")
        )
        and all(
            re.search(pattern, s["console"])
            for pattern in (
                r"\[INFO \] W-\d+-raising_1\.0-stdout MODEL_LOG - about to raise",
                r"\[INFO \] W-\d+-raising_1\.0-stdout MODEL_LOG - logged with logging\.warning",
                r"\[WARN \] W-\d+-\w+_[\d.]+-stderr MODEL_LOG - ",
                r' ACCESS_LOG - /127\.0\.0\.1:\d+ "POST /predictions/echo HTTP/1\.1" 200 \d+',
            )
        )
    ),
    "kserve_envelope": lambda s: (
        s["env_v1"].json() == {"predictions": [1, "two"]}
        and s["env_v1_pred"].json() == {"predictions": [1, "two"]}
        and s["env_v1_explain"].json() == {"explanations": [1]}
        and s["env_v1_text"].code == 503
    ),
    "kservev2_envelope": lambda s: (
        s["env_v2"].json()["id"] == "r1"
        and s["env_v2"].json()["outputs"][0]["data"] == [1, 2]
        and s["env_v2_pred"].json()["id"] == "r1"
        and s["env_v2_bytes"].json()["id"] == s["env_v2_bytes"].header("x-request-id")
        and s["env_v2_bytes"].json()["outputs"][0]["data"] == ["hi"]
        and s["env_v2_text"].code == 503
    ),
}
