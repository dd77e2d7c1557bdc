"""Requests whose tensors lie in a client's GPU memory (KServe CUDA shared memory).

The server hands this module the requests that name CUDA places
(appliance/core/device_tensors.py) and the outputs of the batches that ran
them; cuda_regions.py opens the client's buffers and copies. Here is what
goes where:

- an input is handed to the model as a view of the client's memory when the
  model takes GPU inputs (``Model.device_inputs``) on that GPU and the
  request runs as one prediction, alone (never concatenated into a batch,
  never cut into pieces); otherwise the worker copies it to the host;
- a GPU output bound for the client's region is copied there device to
  device, and the reply carries its place instead of its bytes; other GPU
  outputs are copied to the host for the ring;
- a host output bound for a region is copied there host to device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.config import device as devices
from appliance.core.descriptor import Kind, Message
from appliance.core.device_tensors import (
    OPEN_REGION,
    CudaPlace,
    device_array,
    is_cuda_place,
    on_device,
)
from appliance.core.dtypes import DType
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import Tensor
from appliance.errors import BadRequest, ModelFailed
from appliance.worker.batcher import PREDICT, conform
from appliance.worker.cuda_regions import CudaRegions, download
from appliance.worker.pending import Pending


class ClientGpu:
    """One model worker's handling of tensors in clients' GPU memory.

    Args:
        regions: the client regions this worker has open.
        metadata: the model's declarations.
        device: where the model runs ("cpu" or "cuda:N").
        device_inputs: whether the model takes GPU inputs there.
        sequences: whether the model serves stateful sequences (their
            inputs are the worker's to assemble, so they come to the host).
    """

    def __init__(
        self,
        regions: CudaRegions,
        metadata: ModelMetadata,
        device: str,
        device_inputs: bool,
        sequences: bool,
    ) -> None:
        self.regions = regions
        self.metadata = metadata
        # The GPU the model takes device inputs on, None if it takes none.
        self.gpu = _gpu_index(device) if device_inputs else None
        self.sequences = sequences

    @staticmethod
    def names_any(message: Message) -> bool:
        """Whether a request has tensors or outputs in a client's GPU memory."""
        body = message.body
        return "targets" in body or any(is_cuda_place(e[3]) for e in body.get("tensors", []))

    def place_inputs(self, pending: Pending, entries: list[Any], max_batch_size: int) -> None:
        """Put a request's inputs in GPU memory where the model reads them; read its targets.

        Raises:
            BadRequest: a region does not open, or a target is not an output.
        """
        direct = (
            self.gpu is not None
            and pending.method == PREDICT
            and not self.sequences
            and (pending.key is None or pending.rows <= max_batch_size)
        )
        for name, dtype, shape, place in entries:
            if not is_cuda_place(place) or name not in pending.arrays:
                continue
            where, tensor_dtype, dims = _place(place), DType(dtype), tuple(shape)
            if direct and where.device == self.gpu:
                # Typed as numpy's: a model with device_inputs takes either.
                view: Any = self.regions.array(tensor_dtype, dims, where)
                pending.arrays[name] = view
                pending.key = None  # alone: views of GPU memory are not concatenated
            else:
                pending.arrays[name] = self.regions.to_host(tensor_dtype, dims, where)
        targets = pending.message.body.get("targets")
        if targets:
            pending.targets = self._targets(targets)

    def open_region(self, message: Message, pid: int) -> Message:
        """Open the region a registration names; reply with the bytes it holds from its offset.

        Raises:
            BadRequest: it does not open.
        """
        held = self.regions.open(_place(message.body.get("region")))
        entries = [[OPEN_REGION, DType.INT64.value, [1], 0]]
        payload = held.to_bytes(8, "little", signed=True)
        return Message(Kind.REPLY, message.request_id, pid, {"tensors": entries}, [payload])

    def off_gpu(self, batch: list[Pending], produced: Any) -> Any:
        """Write a lone request's GPU outputs into the client's GPU memory; copy others to host.

        What is written becomes a placeholder without bytes (the reply names
        the place instead), checked against the declared output first.

        Raises:
            ModelFailed: a GPU output is not C-contiguous, or does not fit its declaration.
            BadRequest: the client's region is too small for it.
        """
        if self.gpu is None or not isinstance(produced, dict):
            return produced
        if not any(map(on_device, produced.values())):
            return produced
        pending = batch[0]
        targets = (pending.targets or {}) if len(batch) == 1 else {}
        specs = {spec.name: spec for spec in self.metadata.outputs or ()}
        settled = dict(produced)
        for name, value in produced.items():
            if not on_device(value):
                continue
            try:
                array = device_array(value, self.gpu)
            except ValueError as ex:
                raise ModelFailed(f"model {self.metadata.name} output {name}: {ex}") from None
            place = targets.get(name)
            if place is None:
                settled[name] = download(array)
                continue
            placeholder = array.placeholder()
            spec = specs.get(name)
            if spec is not None:
                conform(self.metadata.name, spec, placeholder)
            self.regions.write(name, array, place)
            settled[name] = placeholder
            if pending.written is None:
                pending.written = set()
            pending.written.add(name)
        return settled

    def to_client(self, pending: Pending, outputs: dict[str, Tensor]) -> dict[str, list[Any]]:
        """Write the outputs bound for a client's GPU memory there; return their reply entries.

        Raises:
            BadRequest: a region is too small, or the copy failed.
        """
        targets = pending.targets or {}
        written = pending.written or set()
        entries = {}
        for name, tensor in outputs.items():
            place = targets.get(name)
            if place is None:
                continue
            if name not in written:
                self.regions.write(name, np.frombuffer(tensor.raw(), np.uint8), place)
            entries[name] = [name, tensor.dtype.value, list(tensor.shape), place.to_body()]
        return entries

    def _targets(self, raw: Any) -> dict[str, CudaPlace]:
        """Read a request's outputs bound for a client's GPU memory.

        Raises:
            BadRequest: not a mapping of output names to places, or an unknown output.
        """
        if not isinstance(raw, dict):
            raise BadRequest("a request's CUDA targets must map output names to places")
        outputs = self.metadata.outputs
        declared = None if outputs is None else {spec.name for spec in outputs}
        targets = {}
        for name, place in raw.items():
            if declared is not None and name not in declared:
                raise BadRequest(
                    f"model {self.metadata.name} has no output named {name!r}; "
                    f"its outputs are {', '.join(sorted(declared))}"
                )
            targets[str(name)] = _place(place)
        return targets


def _gpu_index(device: str) -> int | None:
    """The GPU of "cuda:N" (N), None for the CPU."""
    if not devices.is_cuda(device):
        return None
    return int(device.partition(":")[2] or 0)


def _place(raw: Any) -> CudaPlace:
    """Read a CUDA place from a request.

    Raises:
        BadRequest: it is not one.
    """
    try:
        return CudaPlace.from_body(raw)
    except ValueError as ex:
        raise BadRequest(f"bad CUDA shared memory place: {ex}") from None
