"""The calls of the client API, one core each: infer, stream, derivative, open_region.

Each core is written once, as a generator over the caller's channel, and
:class:`~appliance.client.api.ModelClient` makes its sync and async faces
of it (drive.py). Under them lies what every call shares: picking the
instance, waiting out restarts (:func:`pick`), one request and its one
reply (``_unary``), and the response cache in front of infer.

Apart from api.py, which holds what a client is attached to, what it
serves, the control plane and the channels: this is the request path. Each
core is a function of its client (a :class:`CoreClient`: what it reads of
it) that ModelClient takes as its method, so no call layer stands between
a face and its core (PERF: these run on every request).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from appliance.client.cache import OPTION as cache_option
from appliance.client.cache import ResponseCache
from appliance.client.call import Outbox
from appliance.client.drive import Client, Run, Steps
from appliance.client.ensemble import Ensembles
from appliance.client.inflight import InFlight
from appliance.client.request import TensorLike, derivative_request, request_body
from appliance.client.restarts import RestartWaits
from appliance.client.result import InferResult
from appliance.client.routing import Router, Target
from appliance.client.stream import StreamCall
from appliance.config.settings import ApplianceConfig
from appliance.core.device_tensors import OPEN_REGION, CudaPlace
from appliance.core.metadata import ModelMetadata
from appliance.core.status import SlotState, StatusTable
from appliance.errors import ApplianceError, ErrorCode, ModelNotFound, ModelNotReady, Unsupported
from appliance.observability import tracing
from appliance.observability.metrics import record_call


class CoreClient(Client, Protocol):
    """What the cores read of their ModelClient (api.py), besides its channels."""

    config: ApplianceConfig
    router: Router
    status: StatusTable
    _flight: InFlight
    _cache: ResponseCache | None
    _restarts: RestartWaits

    @property
    def _ensembles(self) -> Ensembles: ...

    def metadata(self, model: str) -> ModelMetadata: ...

    def _pick(
        self, model: str, timeout_s: float | None, parameters: Mapping[str, Any] | None
    ) -> Steps[tuple[Target, float]]: ...


def infer(
    client: CoreClient,
    channel: Outbox,
    model: str,
    inputs: Mapping[str, TensorLike],
    outputs: Sequence[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    targets: Mapping[str, CudaPlace] | None = None,
    request_id: str = "",
) -> Run[InferResult]:
    """Run ``model`` on named inputs; return its (requested) outputs.

    Args:
        model: the model's name.
        inputs: tensors or numpy arrays by input name; a DeviceTensor
            names an input in a client's GPU memory.
        outputs: the outputs wanted, all when None.
        parameters: request parameters passed to the model.
        timeout_s: give up after this long (DeadlineExceeded).
        targets: outputs the worker writes into a client's GPU memory;
            the result holds them as placeholders without bytes.
        request_id: the client's id for the request, which a model may read
            (Triton's ``request.request_id()``).

    Raises:
        ApplianceError: any subclass, with a message for the user.
    """
    ensembles = client._ensembles
    if model in ensembles:
        return ensembles.run(channel, model, inputs, outputs, parameters, timeout_s, targets)
    body = request_body(model, "predict", outputs, parameters, None, targets)
    if request_id:
        body["id"] = request_id
    run = _unary(client, channel, body, inputs, timeout_s)
    cache = client._cache
    if cache is None or targets or not caches(client, model):
        return run
    return _cached(client, cache, model, (inputs, outputs, parameters), run)


def caches(client: CoreClient, model: str) -> bool:
    """Whether ``model``'s answers are kept in the response cache (cache.py)."""
    if client._cache is None:
        return False
    configured = client.config.model(model)
    return configured is not None and bool(configured.options.get(cache_option))


def _cached(
    client: CoreClient,
    cache: ResponseCache,
    model: str,
    request: tuple[Any, ...],
    run: Run[InferResult],
) -> Run[InferResult]:
    """``run``, unless the cache holds its answer; a fresh answer is kept (cache.py)."""
    started = time.perf_counter()
    try:
        key = cache.key(model, client.metadata(model).versions, *request)
    except ApplianceError:
        key = None  # not ready: the run says why
    hit = None if key is None else cache.get(model, key, started)
    if hit is not None:
        record_call(model, ErrorCode.OK, started)
        yield hit
        return
    looked_s = time.perf_counter() - started
    for step in run:
        if key is not None and isinstance(step, InferResult):
            cache.put(model, key, step, looked_s)
        yield step


def stream(
    client: CoreClient,
    channel: Outbox,
    model: str,
    inputs: Mapping[str, TensorLike],
    outputs: Sequence[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    request_id: str = "",
) -> StreamCall:
    """Yield the model's streamed parts as they come.

    Each part is released when the next one is requested; closing the
    generator early (``close``, ``aclose``) cancels the stream in the worker.
    ``request_id``: as for :meth:`infer`.
    """
    body = request_body(model, "stream", outputs, parameters, None)
    if request_id:
        body["id"] = request_id
    return StreamCall(client._pick, client._flight, channel, body, inputs, timeout_s)


def derivative(
    client: CoreClient,
    channel: Outbox,
    model: str,
    method: str,
    inputs: Mapping[str, TensorLike],
    *,
    out_wrt: str,
    in_wrt: str | None = None,
    in_wrt2: str | None = None,
    sens: npt.ArrayLike | None = None,
    vec: npt.ArrayLike | None = None,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Run[npt.NDArray[np.float64]]:
    """Run ``gradient``, ``apply_jacobian`` or ``apply_hessian``.

    For ``apply_hessian``, ``in_wrt`` is the first input and ``in_wrt2``
    the second. Returns a private float64 copy of the model's result.
    """
    wrt = (out_wrt, in_wrt, in_wrt2)
    body, tensors = derivative_request(model, method, inputs, parameters, wrt, sens, vec)
    for step in _unary(client, channel, body, tensors, timeout_s):
        if isinstance(step, InferResult):
            with step:
                yield np.array(step.array("output"), dtype=np.float64)
        else:
            yield step


def open_region(
    client: CoreClient, channel: Outbox, place: CudaPlace, timeout_s: float | None = 30.0
) -> Run[int | None]:
    """Have a model worker on the region's GPU open it, as it will to serve it.

    Returns the bytes its device buffer holds from ``place.offset`` on,
    or None when no ready instance runs on that GPU (then nothing opened it).

    Raises:
        BadRequest: the handle does not open there.
    """
    target = _instance_on(client, f"cuda:{place.device}")
    if target is None:
        yield None
        return
    model, picked = target
    body = {"model": model, "method": OPEN_REGION, "region": place.to_body()}
    deadline = time.monotonic() + timeout_s if timeout_s else 0.0
    call = client._flight.send(channel, picked, deadline, body, {})
    yield call
    with client._flight.settle(call) as result:
        yield int(result.array(OPEN_REGION)[0])


def _instance_on(client: CoreClient, device: str) -> tuple[str, Target] | None:
    """A ready instance (of any model) whose worker runs on ``device``."""
    for model, slots in client.router.slots.items():
        for slot in slots:
            info = client.status.read(slot)
            if info.device == device and info.state == SlotState.READY:
                return model, Target(slot, info.generation, info.pid)
    return None


def _unary(
    client: CoreClient,
    channel: Outbox,
    body: dict[str, Any],
    inputs: Mapping[str, TensorLike],
    timeout_s: float | None,
) -> Run[InferResult]:
    """One request, one reply: the core of infer and derivative."""
    model = body["model"]
    # PERF: try/except rather than the _recorded context manager: this is
    # every call's path.
    started = time.perf_counter()
    traced, traceparent = tracing.start_call(model)
    if traceparent:
        body["trace"] = traceparent  # the worker's spans go under this call's
    try:
        target, deadline = yield from pick(client, model, timeout_s, body.get("params"))
        call = client._flight.send(channel, target, deadline, body, inputs)
        yield call
        result = client._flight.settle(call)
    except ApplianceError as ex:
        record_call(model, ex.code, started)
        if traced is not None:
            traced.end(ex.message)
        raise
    record_call(model, ErrorCode.OK, started)
    if traced is not None:
        traced.end()
    yield result


def pick(
    client: CoreClient, model: str, timeout_s: float | None, parameters: Mapping[str, Any] | None
) -> Steps[tuple[Target, float]]:
    """Choose the instance a call goes to: the one place that picks.

    ``parameters`` may name a sequence, whose instance it must be (routing.py).

    Returns it and the call's deadline. While no instance is ready but
    one is (re)starting, yields how long to pause before trying again
    (restarts.py).
    """
    deadline = time.monotonic() + timeout_s if timeout_s else 0.0
    try:
        return client.router.pick(model, parameters), deadline
    except ModelNotReady:
        pass
    except ModelNotFound:
        if model in client._ensembles:
            raise Unsupported(
                f"{model} is an ensemble: it answers predictions (infer) only, not streams "
                "or derivatives"
            ) from None
        raise
    with contextlib.closing(client._restarts.waits(model, deadline)) as waits:
        for delay in waits:
            yield delay
            with contextlib.suppress(ModelNotReady):
                return client.router.pick(model, parameters), deadline
    raise AssertionError("waits() ends by raising")
