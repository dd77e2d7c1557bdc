"""Entry of a model worker process: load one model instance, then serve it.

Started by the master as ``python -m appliance child model ...``. Everything
long-lived (the ZeroMQ context, the response ring) is created here, after
the process started, never inherited.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq

from appliance.config import device as devices
from appliance.config import scheduling
from appliance.config.reader import read_snapshot
from appliance.config.scheduling import Scheduling
from appliance.config.settings import ConfigError, ModelConfig, ShmConfig
from appliance.core import dtypes
from appliance.core.metadata import ModelMetadata
from appliance.core.ring import ALIGN, Ring, ring_segment
from appliance.core.status import SlotState, StatusTable
from appliance.core.tree import Tree
from appliance.errors import ModelFailed, ShmExhausted
from appliance.observability import logs, tracing
from appliance.processes.exitcodes import ExitCode
from appliance.processes.helper_threads import zmq_context
from appliance.processes.lifetime import become_child
from appliance.worker import warmup
from appliance.worker.batcher import DERIVATIVES
from appliance.worker.cuda_regions import CudaRegions
from appliance.worker.loader import Loaded, LoadError, load_model
from appliance.worker.reshape import Reshapes
from appliance.worker.sequence_settings import settings_for
from appliance.worker.server import WorkerServer

log = logging.getLogger("appliance.worker")

# A response ring sized to its model holds this many of the largest batches'
# outputs at once (more spill into one-off segments, as any reply too large
# for a ring does), and never less than RING_FLOOR_BYTES.
RING_BATCHES = 64
RING_FLOOR_BYTES = 1 << 20


def run(
    tree_dir: Path,
    master_pid: int,
    slot: int,
    generation: int,
    model: str,
    snapshot: Path | None = None,
) -> int:
    """Load ``model`` from the config ``snapshot`` and serve it in ``slot``."""
    tree = Tree(tree_dir.name, tree_dir.parent)
    try:
        config = read_snapshot(snapshot or tree.snapshot_path)
    except ConfigError as ex:
        logs.setup(f"model[{model}]")
        log.error("%s", ex)
        return ExitCode.CONFIG_ERROR
    model_config = config.model(model)
    if model_config is None:
        logs.setup(f"model[{model}]")
        log.error("model %r is not in the config snapshot %s", model, tree.snapshot_path)
        return ExitCode.CONFIG_ERROR
    status = StatusTable.attach(tree.status_name)
    instance = status.read(slot).instance
    title = f"model[{model}#{instance}]"
    logs.setup(title, config.server.log_level)
    become_child(title, master_pid)
    device = devices.resolve(model_config.device, instance)
    # Published before the load, so a model that fails on its GPU shows which.
    status.set_device(slot, device)
    # A Triton Python model's calls to other models (BLS) go to this tree.
    # Imported here, not above: the zygote imports this module and no runtime.
    from appliance.runtimes import bls

    bls.attach(tree, config, status)
    try:
        loaded = load_model(model_config, config.server.python_path, device, instance)
        reshapes = Reshapes.of(model_config.options, loaded.max_batch_size > 0)
        if reshapes is not None:
            loaded = Loaded(loaded.model, reshapes.declared(loaded.metadata))
        sequences = settings_for(model_config, loaded.model, loaded.max_batch_size)
        warmup.run(loaded, model_config.options, _model_dir(model_config.options), reshapes)
        queue = _scheduling(model_config.options, loaded, sequences is not None)
    except (LoadError, ModelFailed) as ex:
        log.error("%s", ex)
        status.set_note(slot, str(ex))
        return ExitCode.MODEL_LOAD_ERROR
    if sequences is not None:
        # Frontends describe the model from this file (KServe's model config).
        loaded = Loaded(
            loaded.model, dataclasses.replace(loaded.metadata, sequence=sequences.describe())
        )
    loaded.metadata.write(tree.metadata_path(model))
    tracing.configure_from(tree.dir, config.traces)
    status.set_note(slot, "")

    wanted = response_ring_bytes(loaded.metadata, model_config, config.shm)
    ring_name = tree.ring_name(what="out")
    try:
        segment = ring_segment(
            ring_name, status.ring_size(wanted, config.shm.min_ring_bytes), "response"
        )
    except ShmExhausted as ex:
        note = f"no response ring: {ex}"
        log.error("%s", note)
        status.set_note(slot, note)
        return ExitCode.NO_SHARED_MEMORY
    ring = Ring(
        segment,
        ring_name,
        config.shm.max_tensor_bytes,
        config.shm.spill_limit_bytes,
        limit_hint=f"models[{model}].response_ring_bytes",
    )
    context = zmq_context(config.server.helper_threads_batch)
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.LINGER, 0)
    server = WorkerServer(
        loaded,
        socket,
        tree.reply_endpoint,
        ring,
        status,
        slot,
        config.shm.inline_threshold_bytes,
        model_config.max_queue_delay_ms / 1000.0,
        model_config.passthrough,
        model_config.max_queue,
        sequences,
        CudaRegions(tree.dir),
        queue,
        reshapes,
    )

    def handle_term(_signum: int, _frame: types.FrameType | None) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, handle_term)
    try:
        socket.bind(tree.model_endpoint(slot, generation))
        log.info(
            "serving (max_batch_size %d, response ring %d KiB)",
            loaded.max_batch_size,
            ring.capacity >> 10,
        )
        server.serve()
    finally:
        status.set_state(slot, SlotState.STOPPING)
        server.close()
        socket.close(0)
        context.term()
        ring.close()
        unload(loaded)
        bls.close()
    log.info("stopped")
    return ExitCode.OK


def _scheduling(options: Mapping[str, Any], loaded: Loaded, sequences: bool) -> Scheduling | None:
    """The model's priorities and queue policies (appliance/config/scheduling.py), if any.

    Raises:
        LoadError: the table does not fit the model as loaded.
    """
    table = options.get(scheduling.OPTION)
    if not table:
        return None
    if sequences:
        raise LoadError(
            f"model {loaded.metadata.name!r}: scheduling: a sequence model's queue follows its "
            "sequences (sequence_batching); priorities and queue policies are dynamic batching's"
        )
    try:
        return scheduling.read(table, loaded.max_batch_size)
    except ValueError as ex:
        raise LoadError(f"model {loaded.metadata.name!r}: scheduling{ex}") from None


def _model_dir(options: Mapping[str, Any]) -> Path | None:
    """A repository model's directory (its file is <model>/<version>/<file>)."""
    path = options.get("path")
    return Path(str(path)).parent.parent if path else None


def unload(loaded: Loaded) -> None:
    """Let the model release what it holds (a Triton Python model's finalize)."""
    try:
        loaded.model.unload()
    except Exception:
        log.exception("model %s: unload raised", loaded.metadata.name)


def response_ring_bytes(metadata: ModelMetadata, model: ModelConfig, shm: ShmConfig) -> int:
    """The response ring's size: the model's own setting, else what its outputs need.

    Where the declared outputs (and, for a model with derivatives, its inputs,
    which a gradient mirrors) bound a batch's bytes, the ring holds
    RING_BATCHES such batches, at least RING_FLOOR_BYTES and at most
    ``shm.response_ring_bytes``; where they do not (a free dimension, BYTES,
    no declaration), ``shm.response_ring_bytes``. Most models' outputs are
    small, and a hundred idle models then need megabytes, not gigabytes.
    """
    if model.response_ring_bytes:
        return model.response_ring_bytes
    specs = list(metadata.outputs or ())
    if any(metadata.supports.get(name) for name in DERIVATIVES):
        specs += metadata.inputs or ()
    total = 0
    for spec in specs:
        # A batch's rows may each be a request of its own, each in its own block.
        rows, shape = 1, spec.shape
        if metadata.max_batch_size > 0 and shape and shape[0] == -1:
            rows, shape = metadata.max_batch_size, shape[1:]
        size = dtypes.item_size(spec.dtype)
        if any(dim < 0 for dim in shape) or size == 0:
            return shm.response_ring_bytes
        total += rows * -(-dtypes.element_count(shape) * size // ALIGN) * ALIGN
    if metadata.outputs is None or total == 0:
        return shm.response_ring_bytes
    return min(shm.response_ring_bytes, max(RING_FLOOR_BYTES, total * RING_BATCHES))
