"""The one internal client API: every protocol reaches models through it.

A :class:`ModelClient` lives in each frontend process (and in any local
process that wants to call models directly, such as tests and benchmarks).
It writes request tensors once into its own shared-memory ring, sends a
descriptor to the least-loaded instance, and hands back the outputs as
read-only views into the worker's response ring, valid until the
:class:`InferResult` is released. It is safe to use from many threads.

Example:
    >>> client = ModelClient.connect(Path("/tmp/appliance-0"))
    >>> with client.infer("simple", {"INPUT0": a, "INPUT1": b}) as result:
    ...     total = result.array("OUTPUT0").copy()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import zmq

from appliance.client.aio import AsyncChannel
from appliance.client.channel import Channel
from appliance.client.restarts import RestartWaits
from appliance.client.routing import Router, Target
from appliance.config import ApplianceConfig, ConfigError, ModelConfig
from appliance.config_reader import read_snapshot
from appliance.core.descriptor import (
    Kind,
    Message,
    SegmentReader,
    block_list,
    place_tensors,
    read_tensors,
    ring_blocks,
)
from appliance.core.metadata import ModelMetadata
from appliance.core.ring import Block, Ring
from appliance.core.segment import Segment
from appliance.core.status import Counter, StatusTable
from appliance.core.tensor import Tensor
from appliance.core.tree import Tree, owner_pid
from appliance.ctl import request
from appliance.errors import (
    ApplianceError,
    BadRequest,
    ErrorCode,
    ModelNotFound,
    ModelNotReady,
    error_from_code,
)
from appliance.metrics import record_call
from appliance.process import pid_alive

TensorLike = Tensor | npt.NDArray[Any]
_DEFAULT_MODEL_CONFIG = ModelConfig("", "")
METADATA_RECHECK_S = 1.0
# Several clients may live in one process (tests do); each owns a ring, and
# every channel of the process needs its own reply endpoint.
_RING_NUMBERS = itertools.count()
_CHANNEL_NUMBERS = itertools.count(1)


class InferResult:
    """Outputs of one request, as views into the worker's response ring.

    Release it (or use it as a context manager) once the outputs have been
    encoded or copied: the worker reuses the space afterwards.
    """

    __slots__ = ("__weakref__", "_release", "outputs")

    def __init__(self, outputs: dict[str, Tensor], release: Any) -> None:
        self.outputs = outputs
        self._release = release

    def __getitem__(self, name: str) -> Tensor:
        return self.outputs[name]

    def array(self, name: str) -> npt.NDArray[Any]:
        return self.outputs[name].array()

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> InferResult:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()


@dataclass(slots=True)
class _StreamCall:
    """A stream in flight: where it went, what it holds, and how far it got."""

    channel: Channel | AsyncChannel
    target: Target
    id: int
    blocks: list[Block]
    deadline: float
    previous: InferResult | None = None
    finished: bool = False


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
        self.inline_threshold = config.shm.inline_threshold_bytes
        self._publish_slot = publish_slot
        self._context: zmq.Context[Any] = zmq.Context()
        self._local = threading.local()
        self._channels: list[Channel] = []
        self._async_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncChannel] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        name = tree.ring_name(what=f"req{next(_RING_NUMBERS)}")
        self._ring = Ring(
            Segment.create(name, ring_bytes or config.shm.request_ring_bytes),
            name,
            config.shm.max_tensor_bytes,
            config.shm.spill_limit_bytes,
            limit_hint="shm.request_ring_bytes",
        )
        self._reader = SegmentReader(Segment.attach)
        self._ids = itertools.count(1)
        self._abandoned: dict[int, tuple[Target, list[Block]]] = {}
        self._metadata: dict[str, tuple[float, float, ModelMetadata, int]] = {}
        self._inflight = 0
        self._spin_budget_s = config.server.spin_wait_us / 1e6
        self._pid = os.getpid()
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

    def _pick(
        self, model: str, timeout_s: float | None, parameters: Mapping[str, Any] | None = None
    ) -> tuple[Target, float]:
        """Choose an instance, waiting out a restart (restarts.py); return it, the deadline.

        ``parameters`` may name a sequence, whose instance it must be (routing.py).
        """
        deadline = time.monotonic() + timeout_s if timeout_s else 0.0
        try:
            return self.router.pick(model, parameters), deadline
        except ModelNotReady:
            pass
        with contextlib.closing(self._restarts.waits(model, deadline)) as waits:
            for delay in waits:
                time.sleep(delay)
                with contextlib.suppress(ModelNotReady):
                    return self.router.pick(model, parameters), deadline
        raise AssertionError("waits() ends by raising")

    async def _pick_async(
        self, model: str, timeout_s: float | None, parameters: Mapping[str, Any] | None = None
    ) -> tuple[Target, float]:
        """:meth:`_pick` for code running in an event loop."""
        deadline = time.monotonic() + timeout_s if timeout_s else 0.0
        try:
            return self.router.pick(model, parameters), deadline
        except ModelNotReady:
            pass
        with contextlib.closing(self._restarts.waits(model, deadline)) as waits:
            for delay in waits:
                await asyncio.sleep(delay)
                with contextlib.suppress(ModelNotReady):
                    return self.router.pick(model, parameters), deadline
        raise AssertionError("waits() ends by raising")

    def _read_layout(self) -> dict[str, list[int]]:
        layout: dict[str, list[int]] = orjson.loads((self.tree.dir / "layout.json").read_bytes())[
            "models"
        ]
        # A new layout follows a reload or a load, which may change a model's
        # [[models]] entry (an override): the snapshot, written first, has the
        # served entries. Unloaded models keep theirs (the repository index
        # lists them).
        with contextlib.suppress(ConfigError):
            served = {model.name: model for model in read_snapshot(self.tree.snapshot_path).models}
            kept = [served.pop(model.name, model) for model in self.config.models]
            self.config = dataclasses.replace(self.config, models=(*kept, *served.values()))
        return layout

    # -- the calls -------------------------------------------------------------

    def infer(
        self,
        model: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> InferResult:
        """Run ``model`` on named inputs; return its (requested) outputs.

        Args:
            model: the model's name.
            inputs: tensors or numpy arrays by input name.
            outputs: the outputs wanted, all when None.
            parameters: request parameters passed to the model.
            timeout_s: give up after this long (DeadlineExceeded).

        Raises:
            ApplianceError: any subclass, with a message for the user.
        """
        return self._roundtrip(model, "predict", inputs, outputs, parameters, timeout_s, None)

    def stream(
        self,
        model: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[InferResult]:
        """Yield the model's streamed parts as they come.

        Each part is released when the next one is requested; closing the
        generator early cancels the stream in the worker.
        """
        with _recorded(model):
            yield from self._stream(model, inputs, outputs, parameters, timeout_s)

    def _stream(
        self,
        model: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None,
        timeout_s: float | None,
    ) -> Iterator[InferResult]:
        picked = self._pick(model, timeout_s, parameters)
        channel = self._channel()
        call = _StreamCall(
            channel,
            *self._send(channel, picked, model, "stream", inputs, outputs, parameters, None),
        )
        try:
            while True:
                part = self._stream_part(call, channel.wait(call.target, call.id, call.deadline))
                if part is None:
                    return
                yield part
        finally:
            self._stream_end(call)

    def _stream_part(self, call: _StreamCall, reply: Message) -> InferResult | None:
        """The part ``reply`` carries; None at the stream's end (or raise its error)."""
        if call.previous is not None:
            call.previous.release()
            call.previous = None
        if reply.kind is Kind.END:
            call.finished = True
            _raise_for(reply)
            return None
        # Parts may borrow request blocks; those stay until the stream ends.
        call.previous = self._result(call.target, reply, call.blocks)[0]
        return call.previous

    def _stream_end(self, call: _StreamCall) -> None:
        """Release the last part; cancel the stream in the worker if it did not end."""
        if call.previous is not None:
            call.previous.release()
        if not call.finished and self.router.is_current(call.target):
            with contextlib.suppress(zmq.ZMQError):
                call.channel.send(call.target, Message(Kind.CANCEL, call.id, self._pid))
        self._finish(call.channel, call.target, call.id, call.blocks, call.finished)

    def derivative(
        self,
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
    ) -> npt.NDArray[np.float64]:
        """Run ``gradient``, ``apply_jacobian`` or ``apply_hessian``.

        For ``apply_hessian``, ``in_wrt`` is the first input and ``in_wrt2``
        the second. Returns a private float64 copy of the model's result.
        """
        tensors, args = _derivative_request(method, inputs, out_wrt, in_wrt, in_wrt2, sens, vec)
        with self._roundtrip(model, method, tensors, None, parameters, timeout_s, args) as result:
            return np.array(result.array("output"), dtype=np.float64)

    # -- the same calls for asyncio frontends ---------------------------------

    async def infer_async(
        self,
        model: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> InferResult:
        """:meth:`infer` for code running in an event loop (no thread hop)."""
        return await self._roundtrip_async(
            model, "predict", inputs, outputs, parameters, timeout_s, None
        )

    async def stream_async(
        self,
        model: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> AsyncGenerator[InferResult, None]:
        """:meth:`stream` for code running in an event loop (no thread hop).

        Each part is released when the next one is requested; closing the
        generator early (``aclose``) cancels the stream in the worker.
        """
        with _recorded(model):
            picked = await self._pick_async(model, timeout_s, parameters)
            channel = self._async_channel()
            call = _StreamCall(
                channel,
                *self._send(channel, picked, model, "stream", inputs, outputs, parameters, None),
            )
            try:
                while True:
                    reply = await channel.wait(call.target, call.id, call.deadline)
                    part = self._stream_part(call, reply)
                    if part is None:
                        return
                    yield part
            finally:
                self._stream_end(call)

    async def derivative_async(
        self,
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
    ) -> npt.NDArray[np.float64]:
        """:meth:`derivative` for code running in an event loop (no thread hop)."""
        tensors, args = _derivative_request(method, inputs, out_wrt, in_wrt, in_wrt2, sens, vec)
        result = await self._roundtrip_async(
            model, method, tensors, None, parameters, timeout_s, args
        )
        with result:
            return np.array(result.array("output"), dtype=np.float64)

    async def _roundtrip_async(
        self,
        model: str,
        method: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None,
        timeout_s: float | None,
        args: dict[str, Any] | None,
    ) -> InferResult:
        started = time.perf_counter()
        try:
            picked = await self._pick_async(model, timeout_s, parameters)
            channel = self._async_channel()
            target, request_id, blocks, deadline = self._send(
                channel, picked, model, method, inputs, outputs, parameters, args
            )
            try:
                reply = await channel.wait(target, request_id, deadline)
            except BaseException:
                self._finish(channel, target, request_id, blocks, False)
                raise
            result = self._settle(channel, target, request_id, blocks, reply)
        except ApplianceError as ex:
            record_call(model, ex.code, started)
            raise
        record_call(model, ErrorCode.OK, started)
        return result

    def _async_channel(self) -> AsyncChannel:
        loop = asyncio.get_running_loop()
        channel = self._async_channels.get(loop)
        if channel is None:
            number = self._next_channel()
            channel = AsyncChannel(
                self._context,
                number,
                self.tree.reply_endpoint(self._pid, number),
                self.tree.model_endpoint,
                self.router,
                self._stray,
            )
            self._async_channels[loop] = channel
        return channel

    # -- what is served --------------------------------------------------------

    def models(self) -> list[str]:
        """Return the served model names, in config order (follows reloads)."""
        return list(self.router.slots)

    def metadata(self, model: str) -> ModelMetadata:
        """Return a model's declared interface.

        Raises:
            ModelNotFound: no such model is configured.
            ModelNotReady: it has not loaded yet.
        """
        if model not in self.router.slots:
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        now = time.monotonic()
        generation = self.status.layout_generation
        cached = self._metadata.get(model)
        # PERF: a protocol asks for metadata on every request; the file only
        # changes when a worker (re)loads, so look at it at most once a second,
        # and at once after a reload swapped instances.
        if cached is not None and now - cached[0] < METADATA_RECHECK_S and cached[3] == generation:
            return cached[2]
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

    def model_ready(self, model: str) -> bool:
        return self.router.ready(model)

    def server_live(self) -> bool:
        return pid_alive(self.status.master_pid)

    def server_ready(self) -> bool:
        """Online, and every configured model has a ready instance."""
        return self.status.online and all(self.router.ready(model) for model in self.router.slots)

    def set_online(self, online: bool) -> None:
        """Ask the master to turn the host's readiness on or off, for all protocols.

        Raises:
            ControlError: the master cannot be reached.
        """
        request(self.tree.control_path, "online" if online else "offline")

    def load_model(
        self, model: str, timeout_s: float = 300.0, overrides: Mapping[str, Any] | None = None
    ) -> None:
        """Have the master (re)load ``model`` from its config; return once it serves.

        ``overrides`` replaces ``[[models]]`` keys (``max_batch_size``,
        ``instances``, ``max_queue_delay_ms``) for this load only; a later
        load without them serves the config's own entry again.

        Raises:
            ControlError: the master refused (unknown model or key, a reload running).
            ModelNotReady: its new instances failed to load, or took too long.
        """
        request(self.tree.control_path, "load", model=model, overrides=dict(overrides or {}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = request(self.tree.control_path, "status")
            if state["reloading"] is None:
                if model in self.router.slots and self.router.ready(model):
                    return
                raise ModelNotReady(
                    f"failed to load model {model}: {self.router.why_not_ready(model)}"
                )
            time.sleep(0.05)
        raise ModelNotReady(f"failed to load model {model}: not ready after {timeout_s:.0f} s")

    def unload_model(self, model: str) -> None:
        """Have the master stop serving ``model``; its workers finish what they hold.

        Raises:
            ControlError: the model is not loaded, or a reload is running.
        """
        request(self.tree.control_path, "unload", model=model)

    def counters(self, model: str) -> dict[Counter, int]:
        """Sum a model's counters over its instances."""
        totals = dict.fromkeys(Counter, 0)
        for slot in self.router.slots.get(model, ()):
            values = self.status.read(slot).counters
            for counter in Counter:
                if counter is Counter.LAST_INFERENCE_MS:
                    totals[counter] = max(totals[counter], values[counter])
                else:
                    totals[counter] += values[counter]
        return totals

    # -- plumbing --------------------------------------------------------------

    def _channel(self) -> Channel:
        channel: Channel | None = getattr(self._local, "channel", None)
        if channel is None:
            number = self._next_channel()
            channel = Channel(
                self._context,
                number,
                self.tree.reply_endpoint(self._pid, number),
                self.tree.model_endpoint,
                self.router,
                self._stray,
                self._spin_s,
            )
            self._local.channel = channel
            with self._lock:
                self._channels.append(channel)
            weakref.finalize(threading.current_thread(), channel.close)
        return channel

    def _roundtrip(
        self,
        model: str,
        method: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None,
        timeout_s: float | None,
        args: dict[str, Any] | None,
    ) -> InferResult:
        # PERF: try/except rather than the _recorded context manager: this is
        # every synchronous call's path.
        started = time.perf_counter()
        try:
            result = self._roundtrip_unrecorded(
                model, method, inputs, outputs, parameters, timeout_s, args
            )
        except ApplianceError as ex:
            record_call(model, ex.code, started)
            raise
        record_call(model, ErrorCode.OK, started)
        return result

    def _roundtrip_unrecorded(
        self,
        model: str,
        method: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None,
        timeout_s: float | None,
        args: dict[str, Any] | None,
    ) -> InferResult:
        picked = self._pick(model, timeout_s, parameters)
        channel = self._channel()
        target, request_id, blocks, deadline = self._send(
            channel, picked, model, method, inputs, outputs, parameters, args
        )
        try:
            reply = channel.wait(target, request_id, deadline)
        except BaseException:
            self._finish(channel, target, request_id, blocks, False)
            raise
        return self._settle(channel, target, request_id, blocks, reply)

    def _settle(
        self,
        channel: Channel | AsyncChannel,
        target: Target,
        request_id: int,
        blocks: list[Block],
        reply: Message,
    ) -> InferResult:
        """Turn a reply into a result (or its error); give back what it does not borrow."""
        kept: list[Block] = []
        try:
            _raise_for(reply)
            result, kept = self._result(target, reply, blocks, keep=True)
            return result
        finally:
            released = [block for block in blocks if block not in kept] if kept else blocks
            self._finish(channel, target, request_id, released, True)

    def _send(
        self,
        channel: Channel | AsyncChannel,
        picked: tuple[Target, float],
        model: str,
        method: str,
        inputs: Mapping[str, TensorLike],
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None,
        args: dict[str, Any] | None,
    ) -> tuple[Target, int, list[Block], float]:
        """Send a request to the instance and by the deadline ``picked`` (see _pick)."""
        target, deadline = picked
        tensors = {name: _tensor(name, value) for name, value in inputs.items()}
        payloads: list[Any] = []
        blocks: list[Block] = []
        try:
            entries = place_tensors(tensors, self, self.inline_threshold, payloads, blocks)
        except BaseException:
            self._release_local(blocks)
            raise
        body: dict[str, Any] = {"model": model, "method": method, "tensors": entries}
        if parameters:
            body["params"] = dict(parameters)
        if outputs is not None:
            body["outputs"] = list(outputs)
        if args is not None:
            body["args"] = args
        request_id = next(self._ids)
        message = Message(Kind.INFER, request_id, self._pid, body, payloads, deadline=deadline)
        channel.expect(request_id)
        self._adjust_inflight(+1)
        self.router.begin(target.slot)
        channel.send(target, message)
        return target, request_id, blocks, deadline

    def _finish(
        self,
        channel: Channel | AsyncChannel,
        target: Target,
        request_id: int,
        blocks: list[Block],
        answered: bool,
    ) -> None:
        self.router.end(target.slot)
        self._adjust_inflight(-1)
        if answered or not self.router.is_current(target):
            self._release_local(blocks)
        elif blocks:
            # SAFETY: the worker may still read these blocks; keep them until
            # its late reply arrives (see _stray) or it dies.
            with self._lock:
                self._abandoned[request_id] = (target, blocks)
        # Last: a final message the caller left untaken is a late reply now.
        channel.forget(request_id)

    def _result(
        self, target: Target, reply: Message, sent: list[Block], keep: bool = False
    ) -> tuple[InferResult, list[Block]]:
        """Wrap a reply's outputs; return it and the request blocks it borrows.

        Outputs in the worker's ring are given back to it on release. Outputs
        that lie in this client's own request blocks (a model that passed an
        input through, see worker/passthrough.py) keep those blocks alive
        until release when ``keep`` is set.
        """
        entries = reply.body.get("tensors", [])
        with self._lock:
            outputs = read_tensors(entries, reply.payloads, self._reader)
        mine = {block.segment for block in sent}
        remote: list[Block] = []
        kept: list[Block] = []
        for block in ring_blocks(entries):
            if block.segment not in mine:
                remote.append(block)
            elif keep:
                kept += [b for b in sent if _contains(b, block) and b not in kept]
        if not remote and not kept:
            return InferResult(outputs, None), kept

        def release() -> None:
            if remote:
                self._release_remote(target, remote)
            self._release_local(kept)

        return InferResult(outputs, release), kept

    def _release_remote(self, target: Target, blocks: list[Block]) -> None:
        if self._closed or not self.router.is_current(target):
            return
        message = Message(Kind.RELEASE, 0, self._pid, {"blocks": block_list(blocks)})
        with contextlib.suppress(zmq.ZMQError):
            self._channel().send(target, message, zmq.NOBLOCK)

    def _next_channel(self) -> int:
        number = next(_CHANNEL_NUMBERS)
        if number > 0xFFFF:
            raise RuntimeError("a client process may open at most 65535 channels")
        return number

    def _stray(self, message: Message) -> None:
        """Take back what a reply nobody waits for still holds."""
        final = message.kind in (Kind.REPLY, Kind.END)
        with self._lock:
            abandoned = (self._abandoned.pop if final else self._abandoned.get)(
                message.request_id, None
            )
        target = abandoned[0] if abandoned else self.router.target_of(message.pid)
        if target is not None:
            self._release_remote(target, ring_blocks(message.body.get("tensors", [])))
        if final and abandoned is not None:
            self._release_local(abandoned[1])
        self._sweep_abandoned()

    def _sweep_abandoned(self) -> None:
        with self._lock:
            gone = [
                rid for rid, (t, _b) in self._abandoned.items() if not self.router.is_current(t)
            ]
            released = [self._abandoned.pop(rid)[1] for rid in gone]
            dead = [name for name in self._reader.names() if not _owner_alive(name)]
            for name in dead:
                self._reader.forget(name)
        for blocks in released:
            self._release_local(blocks)

    # The two methods below make the client its own thread-safe allocator
    # for place_tensors.

    def alloc(self, nbytes: int) -> Block:
        with self._lock:
            block = self._ring.alloc(nbytes)
            self._publish_ring()
            return block

    def _publish_ring(self) -> None:
        if self._publish_slot is not None:
            ring = self._ring
            self.status.set_ring(
                self._publish_slot, ring.used_bytes, ring.capacity, ring.spilled_bytes
            )

    def view(self, block: Block) -> memoryview:
        with self._lock:
            return self._ring.view(block)

    def _release_local(self, blocks: list[Block]) -> None:
        if blocks:
            with self._lock:
                for block in blocks:
                    self._ring.release(block)
                self._publish_ring()

    @property
    def in_flight(self) -> int:
        """Calls of this process waiting for a model now."""
        return self._inflight

    def _spin_s(self) -> float:
        """How long a waiting thread may poll before it blocks (see channel)."""
        return self._spin_budget_s if self._inflight <= 1 else 0.0

    def _adjust_inflight(self, delta: int) -> None:
        with self._lock:
            self._inflight += delta
            inflight = self._inflight
        if self._publish_slot is not None:
            self.status.set_depth(self._publish_slot, inflight)

    def close(self) -> None:
        """Close every socket and unlink this process's ring."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            channels, self._channels = self._channels, []
        for channel in channels:
            channel.close()
        for async_channel in list(self._async_channels.values()):
            async_channel.close()
        self._context.destroy(linger=0)
        self._reader.close()
        self._ring.close()


@contextlib.contextmanager
def _recorded(model: str) -> Iterator[None]:
    """Count a model call (see appliance.metrics) whichever way it ends."""
    started = time.perf_counter()
    try:
        yield
    except ApplianceError as ex:
        record_call(model, ex.code, started)
        raise
    except GeneratorExit:
        record_call(model, ErrorCode.OK, started)
        raise
    record_call(model, ErrorCode.OK, started)


def _contains(outer: Block, inner: Block) -> bool:
    return (
        outer.segment == inner.segment
        and outer.offset <= inner.offset
        and inner.offset + inner.nbytes <= outer.offset + outer.nbytes
    )


def _derivative_request(
    method: str,
    inputs: Mapping[str, TensorLike],
    out_wrt: str,
    in_wrt: str | None,
    in_wrt2: str | None,
    sens: npt.ArrayLike | None,
    vec: npt.ArrayLike | None,
) -> tuple[dict[str, TensorLike], dict[str, Any]]:
    """The tensors and arguments of a derivative call (see ModelClient.derivative)."""
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
    return tensors, args


def _raise_for(reply: Message) -> None:
    if reply.code:
        raise error_from_code(reply.code, reply.error_message)


def _tensor(name: str, value: TensorLike) -> Tensor:
    if isinstance(value, Tensor):
        return value
    try:
        return Tensor.from_array(value)
    except (ValueError, TypeError) as ex:
        raise BadRequest(f"input {name}: {ex}") from None


def _owner_alive(segment_name: str) -> bool:
    pid = owner_pid(segment_name)
    return pid is None or pid_alive(pid)


__all__ = ["ApplianceError", "InferResult", "ModelClient"]
