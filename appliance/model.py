"""What a model author imports: the :class:`Model` base class.

A model declares its inputs and outputs, optionally a maximum batch size, and
implements :meth:`Model.predict`. The appliance runs each instance in its own
process, batches requests from every protocol, and calls ``predict`` with
named numpy arrays. This module depends on ``appliance.core`` only; a model
never imports a frontend or a protocol.

Example:
    A model that adds two vectors, batched up to 8 rows at a time::

        import numpy as np
        from appliance.model import Model, spec

        class Add(Model):
            inputs = [spec("A", "FP32", [-1, 4]), spec("B", "FP32", [-1, 4])]
            outputs = [spec("SUM", "FP32", [-1, 4])]
            max_batch_size = 8

            def predict(self, inputs, parameters):
                return {"SUM": inputs["A"] + inputs["B"]}

    and in the config::

        [[models]]
        name = "add"
        class = "mypackage.add:Add"
        instances = 2
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.core.output_parameters import OutputsWithParameters
from appliance.core.sequences import Control, State, state
from appliance.core.tensor import TensorSpec, spec

__all__ = [
    "Arrays",
    "Model",
    "Outputs",
    "OutputsWithParameters",
    "Request",
    "State",
    "TensorSpec",
    "spec",
    "state",
]

Arrays = dict[str, npt.NDArray[Any]]
Outputs = Mapping[str, npt.ArrayLike]


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a batch, for a model that takes a batch's requests apart
    (:attr:`Model.per_request`, :meth:`Model.predict_requests`)."""

    inputs: Arrays
    parameters: Mapping[str, Any]
    # The outputs the client asked for; None: all of them.
    outputs: Sequence[str] | None
    request_id: str = ""
    # A sequence's id, and its TRITONSERVER_REQUEST_FLAG_* (start 1, end 2).
    correlation_id: int | str = 0
    flags: int = 0


class Model:
    """Base class of every served model.

    Class attributes (a model that learns them from a file may set them
    on the instance in :meth:`load` instead):
        inputs: the declared inputs, in order. ``None`` accepts any named
            tensors (a generic model such as ``echo``).
        outputs: the declared outputs, in order; ``None`` for generic models.
        max_batch_size: rows per batch; 0 disables batching. When above 0,
            every input's and output's first dimension is the batch (-1) and
            requests from all clients are concatenated along it.
        platform, version, description: reported in metadata.
        device: where this instance runs, set before :meth:`load` from the
            config's ``device`` ("cpu", or "cuda:N" once ``cuda`` is spread
            over the GPUs); a model that uses torch moves itself there.
        device_inputs: True when :meth:`predict` takes inputs that lie on
            the model's GPU. An input a client sent in CUDA shared memory
            then arrives as an object with ``__cuda_array_interface__``
            over the client's memory (``torch.as_tensor`` views it without
            a copy), and the model may return its outputs on the GPU (any
            object with that interface): the worker writes them into the
            client's CUDA region, or copies them to the host for the other
            protocols. False (the default): every input is a numpy array.
        sequence_batching: serve stateful sequences (the config's
            ``sequence_batching`` may turn it on or off): every request
            carries a ``sequence_id``, all steps of a sequence run on one
            instance, and a batch holds at most one step per sequence.
        sequence_state: implicit state (see :class:`State`): per sequence,
            an input the worker fills with the state and an output the
            model returns the new state in.
        sequence_controls: input name -> "start", "end", "ready" or
            "corrid": inputs the worker fills per step (1/0 flags as INT32,
            the sequence id as INT64, or BYTES for string ids), one row per
            step of a batch; or -> a :class:`Control` for another type or
            other false/true values. Neither these nor the state appear in
            metadata.

    Request tensors are read-only views into shared memory, valid only during
    the call: copy what you keep. BYTES tensors arrive as object arrays of
    ``bytes``; return str or bytes elements for BYTES outputs.
    """

    inputs: Sequence[TensorSpec] | None = ()
    outputs: Sequence[TensorSpec] | None = ()
    max_batch_size: int = 0
    platform: str = "python"
    version: str = "1"
    description: str = ""
    device: str = "cpu"
    # Which of the model's instances this is (0, 1, ...), set before load().
    instance: int = 0
    device_inputs: bool = False
    sequence_batching: bool = False
    sequence_state: Sequence[State] = ()
    sequence_controls: Mapping[str, str | Control] = {}
    # True: the worker calls predict_requests with the batch's requests one by
    # one (Triton's Python backend), never predict with them concatenated.
    per_request: bool = False
    # What KServe model metadata lists for a model that takes any tensors
    # (inputs/outputs None) yet names some, as MLServer's model-settings.json
    # does: {"inputs": [...], "outputs": [...]} of {"name", "datatype",
    # "shape", "parameters"} and a model-level "parameters". Shown as they
    # are, never checked against requests.
    listed_metadata: Mapping[str, Any] = {}

    def __init__(self, options: Mapping[str, Any]) -> None:
        """Keep the config's ``options`` table; do heavy work in :meth:`load`."""
        self.options = dict(options)

    def load(self) -> None:
        """Load weights or state; runs once in the worker before serving."""

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        """Return named outputs for named inputs.

        Args:
            inputs: the request's (or batch's) inputs by name.
            parameters: request parameters from the protocol (may be empty).

        Returns:
            A mapping of output name to array; for a batched model each
            output's first dimension equals the inputs' first dimension.
            An :class:`OutputsWithParameters` gives each output parameters
            too, which KServe responses carry (every request of the batch
            gets them).

        Raises:
            Exception: any error fails the request (or batch) with its message.
        """
        raise NotImplementedError

    def predict_requests(self, requests: Sequence[Request]) -> Sequence[Outputs | Exception]:
        """Answer each request of a batch (for a model with ``per_request`` set).

        Returns one result per request, in order: its outputs, or the error
        that fails that request alone. Raising fails every request of the batch.
        """
        raise NotImplementedError

    def unload(self) -> None:
        """Release what :meth:`load` took; runs once when the instance stops."""

    def predict_stream(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Iterator[Outputs]:
        """Yield partial outputs; streaming protocols send each as it comes."""
        raise NotImplementedError

    def predict_stream_request(self, request: Request) -> Iterator[Outputs]:
        """The worker's way into :meth:`predict_stream`: the whole request, its id
        and wanted outputs too, for a model that hands them on (Triton's decoupled
        Python models read ``request.request_id()``)."""
        return self.predict_stream(request.inputs, request.parameters)

    def gradient(
        self,
        out_wrt: str,
        in_wrt: str,
        inputs: Arrays,
        sens: npt.NDArray[np.float64],
        parameters: Mapping[str, Any],
    ) -> npt.ArrayLike:
        """Return sens^T J: the gradient of <sens, output out_wrt> w.r.t. in_wrt."""
        raise NotImplementedError

    def apply_jacobian(
        self,
        out_wrt: str,
        in_wrt: str,
        inputs: Arrays,
        vec: npt.NDArray[np.float64],
        parameters: Mapping[str, Any],
    ) -> npt.ArrayLike:
        """Return J vec, with J the Jacobian of output out_wrt w.r.t. in_wrt."""
        raise NotImplementedError

    def apply_hessian(
        self,
        out_wrt: str,
        in_wrt1: str,
        in_wrt2: str,
        inputs: Arrays,
        sens: npt.NDArray[np.float64],
        vec: npt.NDArray[np.float64],
        parameters: Mapping[str, Any],
    ) -> npt.ArrayLike:
        """Return the Hessian of <sens, out_wrt> w.r.t. in_wrt1, in_wrt2, applied to vec."""
        raise NotImplementedError

    def supported(self) -> dict[str, bool]:
        """Which methods this instance serves: :meth:`supports`, unless a
        model's file decides (a Triton decoupled model streams only)."""
        return self.supports()

    @classmethod
    def supports(cls) -> dict[str, bool]:
        """Return which optional methods this model implements."""
        return {
            method: getattr(cls, method) is not getattr(Model, method)
            for method in (
                "predict",
                "predict_stream",
                "gradient",
                "apply_jacobian",
                "apply_hessian",
            )
        }
