"""The one internal client API: every protocol reaches models through it.

A :class:`ModelClient` lives in each frontend process (and in any local
process that wants to call models directly, such as tests and benchmarks).
It writes request tensors once into its own shared-memory ring, sends a
descriptor to the least-loaded instance, and hands back the outputs as
read-only views into the worker's response ring, valid until the
:class:`InferResult` is released. It is safe to use from many threads.

This module holds the client and its entry points; call_cores.py holds
each call's core (infer, stream, derivative), inflight.py keeps the
requests in flight and the ring space they hold, drive.py waits for
replies (in a thread or an event loop), control.py asks the master to
load, unload or go offline, and routing.py picks the instance.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from appliance.client import call_cores, control
from appliance.client.aio import AsyncChannel
from appliance.client.cache import ResponseCache
from appliance.client.channel import Channel, Wiring
from appliance.client.drive import Steps
from appliance.client.ensemble import Ensembles
from appliance.client.faces import in_loop, in_thread, stream_in_loop, stream_in_thread
from appliance.client.inflight import InFlight
from appliance.client.restarts import RestartWaits
from appliance.client.result import InferResult
from appliance.client.routing import Router, Target
from appliance.config.reader import read_snapshot
from appliance.config.settings import ApplianceConfig, ConfigError, EnsembleConfig, ModelConfig
from appliance.core.metadata import ModelMetadata
from appliance.core.status import Counter, StatusTable
from appliance.core.tree import Tree
from appliance.errors import ApplianceError, ModelNotFound, ModelNotReady, Unsupported
from appliance.formats import repository
from appliance.formats.repository_layout import (
    ONNX_CLASS,
    PYTHON_CLASS,
    TORCHSCRIPT_CLASS,
    RepositoryError,
)
from appliance.observability import tracing
from appliance.processes.helper_threads import zmq_context
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
        self._context = zmq_context(config.server.helper_threads_batch)
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

    # -- the calls: one core each (call_cores.py), sync and async faces (faces.py)

    infer = in_thread(call_cores.infer)
    infer_async = in_loop(call_cores.infer)

    def caches(self, model: str) -> bool:
        """Whether ``model``'s answers are kept in the response cache (cache.py)."""
        return call_cores.caches(self, model)

    stream = stream_in_thread(call_cores.stream)
    stream_async = stream_in_loop(call_cores.stream)
    derivative = in_thread(call_cores.derivative)
    derivative_async = in_loop(call_cores.derivative)
    open_region = in_thread(call_cores.open_region)

    def _pick(
        self, model: str, timeout_s: float | None, parameters: Mapping[str, Any] | None
    ) -> Steps[tuple[Target, float]]:
        """The one place that picks an instance, as streams and ensembles take it.

        A method that calls the core (call_cores.pick) rather than the core
        itself: compiled (appliance/native.py), a function kept on a class
        does not bind.
        """
        return call_cores.pick(self, model, timeout_s, parameters)

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

    def known_models(self) -> dict[str, str]:
        """Return model -> version for every model configured or in a repository now.

        The repositories are scanned afresh, so a model dropped into one since
        the start is known (and loadable); the version is "" for a model that
        is not a repository file. A model once loaded from shipped files is not
        (its files are gone once it no longer serves).
        """
        runtimes = (ONNX_CLASS, TORCHSCRIPT_CLASS, PYTHON_CLASS)
        shipped = os.path.join(os.path.realpath(self.tree.inline_dir), "")
        known = {
            model.name: str(model.options.get("version", "")) if model.cls in runtimes else ""
            for model in self.config.models
            if not str(model.options.get("path", "")).startswith(shipped)
        }
        known.update((ensemble.name, ensemble.version) for ensemble in self.config.ensembles)
        for entry in self.repository_entries():
            # An ensemble's entry carries its version itself; a model's, in its options.
            known[entry["name"]] = str(entry.get("options", entry).get("version", ""))
        return known

    def repository_entries(self) -> list[dict[str, Any]]:
        """Every ``[[models]]`` entry the repositories give now (scanned afresh)."""
        found: list[dict[str, Any]] = []
        for repo in self.config.repositories:
            try:
                found += repository.scan(Path(repo.path), repo.versions, repo.models, repo.envelope)
            except RepositoryError:
                continue  # the master refuses such a config at its next reload
        return found

    def ensemble(self, name: str) -> EnsembleConfig | None:
        """An ensemble's declaration (None for a model or an unknown name)."""
        plan = self._ensembles.get(name)
        return plan.config if plan is not None else None

    def trace_settings(
        self, model: str | None, changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Read (``changes`` None) or change this process's trace settings, global or of
        ``model``; a None value in ``changes`` clears the model's own setting (it follows
        the global one again).

        Raises:
            ModelNotFound: no such model.
            BadRequest: an unknown setting or a bad value.
            Unsupported: this process keeps no trace settings.
        """
        settings = tracing.settings()
        if settings is None:
            raise Unsupported("this server process keeps no trace settings")
        if model and model not in self.models():
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        if changes:
            return settings.update(model or None, changes)
        return settings.get(model or None)

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


__all__ = ["ApplianceError", "InferResult", "ModelClient"]
