"""A stream in flight: the core of ModelClient.stream, driven part by part (drive.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from appliance.client.call import Call, Outbox
from appliance.client.drive import Pick, Run
from appliance.client.inflight import InFlight
from appliance.client.request import TensorLike
from appliance.client.result import InferResult
from appliance.errors import ApplianceError, ErrorCode
from appliance.observability import tracing
from appliance.observability.metrics import record_call, record_stream_response


class StreamCall:
    """A stream in flight, as the stream faces (drive.py) take it, part by part."""

    def __init__(
        self,
        pick: Pick,
        flight: InFlight,
        channel: Outbox,
        body: dict[str, Any],
        inputs: Mapping[str, TensorLike],
        timeout_s: float | None,
    ) -> None:
        self._pick = pick
        self._flight = flight
        self._request = (channel, body, inputs, timeout_s)
        self._call: Call | None = None
        self._started = 0.0
        self._responses = 0
        self._traced: tracing.CallTrace | None = None

    def open(self) -> Run[None]:
        channel, body, inputs, timeout_s = self._request
        target, deadline = yield from self._pick(body["model"], timeout_s, body.get("params"))
        self._call = self._flight.send(channel, target, deadline, body, inputs)
        # A slow reader pauses the stream at its worker (see channel.py).
        channel.watch(self._call.id, target)
        yield None

    def next(self) -> Run[InferResult | None]:
        assert self._call is not None
        yield self._call
        part = self._flight.part(self._call)
        if part is not None:
            first = self._responses == 0
            self._responses += 1
            record_stream_response(self._request[1]["model"], self._started if first else None)
        yield part

    def __enter__(self) -> StreamCall:
        self._started = time.perf_counter()
        body = self._request[1]
        # A sampled request's stream is its ``infer`` span, as a unary call's is.
        self._traced, traceparent = tracing.start_call(body["model"])
        if traceparent:
            body["trace"] = traceparent
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """End the stream; count it (see appliance.observability.metrics) whichever way it ended."""
        if self._call is not None:
            self._flight.end_stream(self._call)
        model = self._request[1]["model"]
        if error is None or isinstance(error, GeneratorExit):
            record_call(model, ErrorCode.OK, self._started)
        elif isinstance(error, ApplianceError):
            record_call(model, error.code, self._started)
        if self._traced is not None:
            self._traced.end(error.message if isinstance(error, ApplianceError) else "")
