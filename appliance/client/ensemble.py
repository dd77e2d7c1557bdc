"""Ensembles: a graph of served models, run by the client API, with no copy between steps.

An ensemble (appliance/config/ensembles.py) has no worker of its own. A call to it
runs its steps from here, each an ordinary call to its model (routed,
batched, counted and timed as any other), and every protocol calls an
ensemble as it calls a model.

This module keeps the ensembles a client serves and answers for them
(readiness, counters, the entry of a call); a declaration is read into its
plan in ensemble_plan.py, and a call runs, step by step and with no copy
between steps, in ensemble_run.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from appliance.client.call import Outbox
from appliance.client.drive import Pick, Run
from appliance.client.ensemble_plan import Plan
from appliance.client.ensemble_run import EnsembleRun
from appliance.client.inflight import InFlight
from appliance.client.request import TensorLike
from appliance.client.result import InferResult
from appliance.client.routing import Router
from appliance.client.traffic import call_totals
from appliance.config.settings import EnsembleConfig
from appliance.core.device_tensors import CudaPlace
from appliance.core.status import Counter
from appliance.errors import ApplianceError, BadRequest, ErrorCode
from appliance.observability import tracing
from appliance.observability.metrics import record_call


class Ensembles:
    """The ensembles a client serves, and running them.

    Args:
        flight: the client's requests in flight and its ring.
        router: instance states (is a step's model ready).
        pick: chooses a step's instance (ModelClient._pick).
        inline_threshold: tensors up to this size ride in the message.
    """

    def __init__(self, flight: InFlight, router: Router, pick: Pick, inline_threshold: int) -> None:
        self._flight = flight
        self._router = router
        self._pick = pick
        self._inline = inline_threshold
        self._plans: dict[str, Plan] = {}

    def serve(self, configs: Sequence[EnsembleConfig]) -> None:
        """Serve these ensembles (a snapshot's); one unchanged keeps its plan and metadata."""
        plans = {}
        for config in configs:
            known = self._plans.get(config.name)
            plans[config.name] = (
                known if known is not None and known.config == config else Plan.of(config)
            )
        self._plans = plans

    def __contains__(self, name: str) -> bool:
        return name in self._plans

    def names(self) -> list[str]:
        return list(self._plans)

    def get(self, name: str) -> Plan | None:
        return self._plans.get(name)

    def ready(self, name: str) -> bool:
        """Ready when every step's model has a ready instance."""
        plan = self._plans[name]
        return all(self._router.ready(model) for model in plan.models)

    def why_not_ready(self, name: str) -> str:
        plan = self._plans[name]
        waiting = [model for model in plan.models if not self._router.ready(model)]
        if not waiting:
            return ""
        return (
            f"ensemble {name} waits for its step models: {self._router.why_not_ready(waiting[0])}"
        )

    def counters(
        self, name: str, step_counters: Callable[[str], dict[Counter, int]]
    ) -> dict[Counter, int]:
        """An ensemble's counters: its own calls, as every process recorded them (metrics.py).

        Requests count once, as one execution of one row each; compute time
        is the ensemble's whole time; the last inference is its steps' last.
        """
        plan = self._plans[name]
        ok, failed, seconds = call_totals(name)
        totals = dict.fromkeys(Counter, 0)
        totals[Counter.SUCCESS] = totals[Counter.BATCHES] = totals[Counter.BATCH_ROWS] = ok
        totals[Counter.FAIL] = failed
        totals[Counter.COMPUTE_NS] = int(seconds * 1e9)
        totals[Counter.LAST_INFERENCE_MS] = max(
            step_counters(model)[Counter.LAST_INFERENCE_MS] for model in plan.models
        )
        return totals

    def run(
        self,
        channel: Outbox,
        name: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None,
        timeout_s: float | None,
        targets: Mapping[str, CudaPlace] | None,
    ) -> Run[InferResult]:
        """One call of an ensemble (the core of ModelClient.infer for it)."""
        started = time.perf_counter()
        traced, _traceparent = tracing.start_call(name)
        try:
            if targets:
                raise BadRequest(
                    f"ensemble {name}: its outputs cannot be written into CUDA shared memory; "
                    "ask for them in the response or in system shared memory"
                )
            deadline = time.monotonic() + timeout_s if timeout_s else 0.0
            plan = self._plans[name]
            ensemble = EnsembleRun(
                self._flight, self._pick, self._inline, plan, channel, parameters, deadline, traced
            )
            self._flight.hold(+1)
            try:
                result = yield from ensemble.steps(inputs, outputs)
            finally:
                self._flight.hold(-1)
        except ApplianceError as ex:
            record_call(name, ex.code, started)
            if traced is not None:
                traced.end(ex.message)
            raise
        record_call(name, ErrorCode.OK, started)
        if traced is not None:
            traced.end()
        yield result
