"""The one internal client API: every protocol reaches models through it.

A :class:`ModelClient` lives in each frontend process (and in any local
process that wants to call models directly, such as tests and benchmarks).
It writes request tensors once into its own shared-memory ring, sends a
descriptor to the least-loaded instance, and hands back the outputs as
read-only views into the worker's response ring, valid until the
:class:`InferResult` is released. It is safe to use from many threads.

This module holds the entry points; inflight.py keeps the requests in
flight and the ring space they hold, drive.py waits for replies (in a
thread or an event loop), control.py asks the master to load, unload or go
offline, and routing.py picks the instance.

Example:
    >>> client = ModelClient.connect(Path("/tmp/appliance-0"))
    >>> with client.infer("simple", {"INPUT0": a, "INPUT1": b}) as result:
    ...     total = result.array("OUTPUT0").copy()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import zmq

from appliance.client import control
from appliance.client.aio import AsyncChannel
from appliance.client.cache import OPTION as cache_option
from appliance.client.cache import ResponseCache
from appliance.client.channel import Channel, Wiring
from appliance.client.drive import Run, Steps, in_loop, in_thread, stream_in_loop, stream_in_thread
from appliance.client.ensemble import Ensembles
from appliance.client.inflight import (
    InferResult,
    InFlight,
    Outbox,
    TensorLike,
    request_body,
)
from appliance.client.restarts import RestartWaits
from appliance.client.routing import Router, Target
from appliance.client.stream import StreamCall
from appliance.config.reader import read_snapshot
from appliance.config.settings import ApplianceConfig, ConfigError, EnsembleConfig, ModelConfig
from appliance.core.device_tensors import OPEN_REGION, CudaPlace
from appliance.core.metadata import ModelMetadata
from appliance.core.status import Counter, SlotState, StatusTable
from appliance.core.tree import Tree
from appliance.errors import ApplianceError, ErrorCode, ModelNotFound, ModelNotReady, Unsupported
from appliance.observability import tracing
from appliance.observability.metrics import record_call
from appliance.processes.lifetime import pid_alive

_DEFAULT_MODEL_CONFIG = ModelConfig("", "")
METADATA_RECHECK_S = 1.0
# Several clients may live in one process (tests do); each owns a ring, and
# every channel of the process needs its own reply endpoint.
_RING_NUMBERS = itertools.count()
_CHANNEL_NUMBERS = itertools.count(1)


class ModelClient:
    """Call models of one appliance tree.

    Args:
        tree: the tree to talk to.
        config: its configuration snapshot.
        status: its status table.
        publish_slot: the status slot this process reports its in-flight
            count in (frontends do, so the master knows when a drain is done).
        ring_bytes: size of this process's request ring.
    """

    def __init__(
        self,
        tree: Tree,
        config: ApplianceConfig,
        status: StatusTable,
        publish_slot: int | None = None,
        ring_bytes: int | None = None,
    ) -> None:
        self.tree = tree
        self.config = config
        self.status = status
        self.router = Router(status, self._read_layout)
        self._restarts = RestartWaits(self.router, self._restart_limits)
        self._context: zmq.Context[Any] = zmq.Context()
        self._local = threading.local()
        self._channels: list[Channel] = []
        self._async_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncChannel] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        shm = config.shm
        self._flight = InFlight(
            self.router,
            status,
            publish_slot,
            tree.ring_name(what=f"req{next(_RING_NUMBERS)}"),
            ring_bytes or shm.request_ring_bytes,
            shm,
            self._channel,
        )
        self._pid = os.getpid()
        self._wiring = Wiring(
            self._context,
            functools.partial(tree.reply_endpoint, self._pid),
            tree.model_endpoint,
            self.router,
            self._flight.stray,
        )
        self._metadata: dict[str, tuple[float, float, ModelMetadata, int]] = {}
        size = config.server.response_cache_bytes
        self._cache = ResponseCache(size) if size else None
        # Ensembles run here, in the caller's process (ensemble.py).
        self._served_ensembles = Ensembles(
            self._flight, self.router, self._pick, shm.inline_threshold_bytes
        )
        self._served_ensembles.serve(config.ensembles)
        self._spin_budget_s = config.server.spin_wait_us / 1e6
        self._closed = False

    @classmethod
    def connect(cls, run_dir: Path, ring_bytes: int | None = None) -> ModelClient:
        """Attach to the appliance whose ``run_dir`` is given, from any local process.

        Raises:
            FileNotFoundError: no appliance is running with that run_dir.
        """
        state = orjson.loads((run_dir / "appliance.json").read_bytes())
        tree = Tree(str(state["tree"]), run_dir)
        config = read_snapshot(tree.snapshot_path)
        status = StatusTable.attach(tree.status_name)
        return cls(tree, config, status, ring_bytes=ring_bytes)

    def _restart_limits(self, model: str) -> tuple[float, int]:
        """A model's (restart_wait_s, max_queue), as served (see :meth:`_read_layout`)."""
        entry = self.config.model(model) or _DEFAULT_MODEL_CONFIG
        return entry.restart_wait_s, entry.max_queue

    def _read_layout(self) -> dict[str, list[int]]:
        layout: dict[str, list[int]] = orjson.loads((self.tree.dir / "layout.json").read_bytes())[
            "models"
        ]
        # A new layout follows a reload or a load, which may change a model's
        # [[models]] entry (an override): the snapshot, written first, has the
        # served entries. Unloaded models and ensembles keep theirs (the
        # repository index lists them).
        with contextlib.suppress(ConfigError):
            snapshot = read_snapshot(self.tree.snapshot_path)
            served = {model.name: model for model in snapshot.models}
            kept = [served.pop(model.name, model) for model in self.config.models]
            ensembles = {ensemble.name: ensemble for ensemble in self.config.ensembles}
            ensembles.update((ensemble.name, ensemble) for ensemble in snapshot.ensembles)
            self.config = dataclasses.replace(
                self.config,
                models=(*kept, *served.values()),
                ensembles=tuple(ensembles.values()),
            )
            self._served_ensembles.serve(snapshot.ensembles)
        return layout

    @property
    def _ensembles(self) -> Ensembles:
        """The ensembles served now, a load's or reload's new layout read first."""
        self.router.follow()
        return self._served_ensembles

    # -- the calls: one core each, with sync and async faces (drive.py) -------

    def _infer(
        self,
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
        ensembles = self._ensembles
        if model in ensembles:
            return ensembles.run(channel, model, inputs, outputs, parameters, timeout_s, targets)
        body = request_body(model, "predict", outputs, parameters, None, targets)
        if request_id:
            body["id"] = request_id
        run = self._unary(channel, body, inputs, timeout_s)
        cache = self._cache
        if cache is None or targets or not self.caches(model):
            return run
        return self._cached(cache, model, (inputs, outputs, parameters), run)

    infer = in_thread(_infer)
    infer_async = in_loop(_infer)

    def caches(self, model: str) -> bool:
        """Whether ``model``'s answers are kept in the response cache (cache.py)."""
        if self._cache is None:
            return False
        configured = self.config.model(model)
        return configured is not None and bool(configured.options.get(cache_option))

    def _cached(
        self, cache: ResponseCache, model: str, request: tuple[Any, ...], run: Run[InferResult]
    ) -> Run[InferResult]:
        """``run``, unless the cache holds its answer; a fresh answer is kept (cache.py)."""
        started = time.perf_counter()
        try:
            key = cache.key(model, self.metadata(model).versions, *request)
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

    def _stream(
        self,
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
        return StreamCall(self._pick, self._flight, channel, body, inputs, timeout_s)

    stream = stream_in_thread(_stream)
    stream_async = stream_in_loop(_stream)

    def _derivative(
        self,
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
        body, tensors = _derivative_request(model, method, inputs, parameters, wrt, sens, vec)
        for step in self._unary(channel, body, tensors, timeout_s):
            if isinstance(step, InferResult):
                with step:
                    yield np.array(step.array("output"), dtype=np.float64)
            else:
                yield step

    derivative = in_thread(_derivative)
    derivative_async = in_loop(_derivative)

    def _open_region(
        self, channel: Outbox, place: CudaPlace, timeout_s: float | None = 30.0
    ) -> Run[int | None]:
        """Have a model worker on the region's GPU open it, as it will to serve it.

        Returns the bytes its device buffer holds from ``place.offset`` on,
        or None when no ready instance runs on that GPU (then nothing opened it).

        Raises:
            BadRequest: the handle does not open there.
        """
        target = self._instance_on(f"cuda:{place.device}")
        if target is None:
            yield None
            return
        model, picked = target
        body = {"model": model, "method": OPEN_REGION, "region": place.to_body()}
        deadline = time.monotonic() + timeout_s if timeout_s else 0.0
        call = self._flight.send(channel, picked, deadline, body, {})
        yield call
        with self._flight.settle(call) as result:
            yield int(result.array(OPEN_REGION)[0])

    open_region = in_thread(_open_region)

    def _instance_on(self, device: str) -> tuple[str, Target] | None:
        """A ready instance (of any model) whose worker runs on ``device``."""
        for model, slots in self.router.slots.items():
            for slot in slots:
                info = self.status.read(slot)
                if info.device == device and info.state == SlotState.READY:
                    return model, Target(slot, info.generation, info.pid)
        return None

    def _unary(
        self,
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
            target, deadline = yield from self._pick(model, timeout_s, body.get("params"))
            call = self._flight.send(channel, target, deadline, body, inputs)
            yield call
            result = self._flight.settle(call)
        except ApplianceError as ex:
            record_call(model, ex.code, started)
            if traced is not None:
                traced.end(ex.message)
            raise
        record_call(model, ErrorCode.OK, started)
        if traced is not None:
            traced.end()
        yield result

    def _pick(
        self, model: str, timeout_s: float | None, parameters: Mapping[str, Any] | None
    ) -> Steps[tuple[Target, float]]:
        """Choose the instance a call goes to: the one place that picks.

        ``parameters`` may name a sequence, whose instance it must be (routing.py).

        Returns it and the call's deadline. While no instance is ready but
        one is (re)starting, yields how long to pause before trying again
        (restarts.py).
        """
        deadline = time.monotonic() + timeout_s if timeout_s else 0.0
        try:
            return self.router.pick(model, parameters), deadline
        except ModelNotReady:
            pass
        except ModelNotFound:
            if model in self._ensembles:
                raise Unsupported(
                    f"{model} is an ensemble: it answers predictions (infer) only, not streams "
                    "or derivatives"
                ) from None
            raise
        with contextlib.closing(self._restarts.waits(model, deadline)) as waits:
            for delay in waits:
                yield delay
                with contextlib.suppress(ModelNotReady):
                    return self.router.pick(model, parameters), deadline
        raise AssertionError("waits() ends by raising")

    # -- what is served --------------------------------------------------------

    def models(self) -> list[str]:
        """Return the served model names, in config order (follows reloads), then the ensembles."""
        return [*self.router.slots, *self._ensembles.names()]

    def metadata(self, model: str) -> ModelMetadata:
        """Return a model's declared interface.

        Raises:
            ModelNotFound: no such model is configured.
            ModelNotReady: it has not loaded yet.
        """
        now = time.monotonic()
        generation = self.status.layout_generation
        cached = self._metadata.get(model)
        # PERF: a protocol asks for metadata on every request; the file only
        # changes when a worker (re)loads, so look at it at most once a second,
        # and at once after a reload or a load swapped instances or made the
        # name an ensemble's (only models are kept here).
        if cached is not None and now - cached[0] < METADATA_RECHECK_S and cached[3] == generation:
            return cached[2]
        plan = self._ensembles.get(model)
        if plan is not None:
            return plan.metadata  # declared: known before its steps load
        if model not in self.router.slots:
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        path = self.tree.metadata_path(model)
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            raise ModelNotReady(
                f"model {model} has not loaded yet; {self.router.why_not_ready(model)}"
            ) from None
        meta = cached[2] if cached is not None and cached[1] == mtime else ModelMetadata.read(path)
        self._metadata[model] = (now, mtime, meta, generation)
        return meta

    def ensemble(self, name: str) -> EnsembleConfig | None:
        """An ensemble's declaration (None for a model or an unknown name)."""
        plan = self._ensembles.get(name)
        return plan.config if plan is not None else None

    def model_ready(self, model: str) -> bool:
        ensembles = self._ensembles
        if model in ensembles:
            return ensembles.ready(model)
        return self.router.ready(model)

    def why_not_ready(self, model: str) -> str:
        """Why a model (or an ensemble) is not ready, for a user to act on."""
        ensembles = self._ensembles
        if model in ensembles:
            return ensembles.why_not_ready(model)
        return self.router.why_not_ready(model)

    def server_live(self) -> bool:
        return pid_alive(self.status.master_pid)

    def server_ready(self) -> bool:
        """Online, and every configured model has a ready instance."""
        return self.status.online and all(self.router.ready(model) for model in self.router.slots)

    def counters(self, model: str) -> dict[Counter, int]:
        """Sum a model's counters over its instances (an ensemble's: ensemble.py)."""
        ensembles = self._ensembles
        if model in ensembles:
            return ensembles.counters(model, self.counters)
        totals = dict.fromkeys(Counter, 0)
        for slot in self.router.slots.get(model, ()):
            values = self.status.read(slot).counters
            for counter in Counter:
                if counter is Counter.LAST_INFERENCE_MS:
                    totals[counter] = max(totals[counter], values[counter])
                else:
                    totals[counter] += values[counter]
        return totals

    # -- the control plane (control.py) ---------------------------------------

    def set_online(self, online: bool) -> None:
        """Turn the host's readiness on or off for all protocols (see control.py)."""
        control.set_online(self.tree, online)

    def master_status(self, timeout_s: float = 2.0) -> dict[str, Any] | None:
        """The master's own status, or None if it does not answer in time (see control.py)."""
        return control.master_status(self.tree, timeout_s)

    def load_model(
        self,
        model: str,
        timeout_s: float = 300.0,
        overrides: Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """(Re)load ``model``, with ``overrides`` of its config; return once it serves.

        ``files`` ships the model's own files (a model directory's relative
        paths -> contents). See :func:`appliance.client.control.load_model`
        (and its errors).
        """
        control.load_model(self.tree, self.router, model, timeout_s, overrides, files)

    def unload_model(self, model: str) -> None:
        """Stop serving ``model`` (see control.py)."""
        control.unload_model(self.tree, model)

    # -- plumbing --------------------------------------------------------------

    def _channel(self) -> Channel:
        """The calling thread's channel (made on first use)."""
        channel: Channel | None = getattr(self._local, "channel", None)
        if channel is None:
            channel = Channel(self._wiring, self._next_channel(), self._spin_s)
            self._local.channel = channel
            with self._lock:
                self._channels.append(channel)
            weakref.finalize(threading.current_thread(), channel.close)
        return channel

    def _async_channel(self) -> AsyncChannel:
        """The running event loop's channel (made on first use)."""
        loop = asyncio.get_running_loop()
        channel = self._async_channels.get(loop)
        if channel is None:
            channel = AsyncChannel(self._wiring, self._next_channel())
            self._async_channels[loop] = channel
        return channel

    def _next_channel(self) -> int:
        number = next(_CHANNEL_NUMBERS)
        if number > 0xFFFF:
            raise RuntimeError("a client process may open at most 65535 channels")
        return number

    @property
    def in_flight(self) -> int:
        """Calls of this process waiting for a model now."""
        return self._flight.count

    @property
    def ring_used_bytes(self) -> int:
        """Bytes of this process's request ring in use now (what its results still hold)."""
        return self._flight.ring_used_bytes

    def _spin_s(self) -> float:
        """How long a waiting thread may poll before it blocks (see channel)."""
        return self._spin_budget_s if self._flight.count <= 1 else 0.0

    def close(self) -> None:
        """Close every socket and unlink this process's ring."""
        if self._closed:
            return
        self._closed = True
        self._flight.close()  # first: a result released from now on gives nothing back
        with self._lock:
            channels, self._channels = self._channels, []
        for channel in channels:
            channel.close()
        for async_channel in list(self._async_channels.values()):
            async_channel.close()
        self._context.destroy(linger=0)


def _derivative_request(
    model: str,
    method: str,
    inputs: Mapping[str, TensorLike],
    parameters: Mapping[str, Any] | None,
    wrt: tuple[str, str | None, str | None],
    sens: npt.ArrayLike | None,
    vec: npt.ArrayLike | None,
) -> tuple[dict[str, Any], dict[str, TensorLike]]:
    """The body and tensors of a derivative call (see ModelClient.derivative)."""
    out_wrt, in_wrt, in_wrt2 = wrt
    tensors: dict[str, TensorLike] = dict(inputs)
    if sens is not None:
        tensors["__sens__"] = np.asarray(sens, dtype=np.float64)
    if vec is not None:
        tensors["__vec__"] = np.asarray(vec, dtype=np.float64)
    args: dict[str, Any] = {"out_wrt": out_wrt}
    if method == "apply_hessian":
        args.update(in_wrt1=in_wrt, in_wrt2=in_wrt2)
    else:
        args["in_wrt"] = in_wrt
    return request_body(model, method, None, parameters, args), tensors


__all__ = ["ApplianceError", "InferResult", "ModelClient"]
