"""``triton_python_backend_utils``: what a Triton Python-backend ``model.py`` imports.

A Triton Python model is a ``model.py`` defining ``TritonPythonModel`` that
imports this module as ``pb_utils``. The appliance's Python-backend runtime
(``python_backend.py``) registers this module under Triton's name before it
imports a ``model.py``, so models run unmodified with no Triton installed.

What it holds, as Triton's users use it: :class:`Tensor` (input tensors are
read-only views of the shared memory the request arrived in),
:class:`InferenceRequest` and :class:`InferenceResponse`, :class:`TritonError`
with its codes, :class:`TritonModelException`, :class:`Logger`, the helpers
that look tensors and tensor configs up by name and convert Triton's type
names, the request and response flags, :class:`ModelConfig` for
``auto_complete_config``, and :class:`MetricFamily` for the model's own metrics.
The values its BLS calls (bls.py) hand back too, :class:`Tensor`,
:class:`InferenceResponse`, :class:`TritonError`, :class:`TritonModelException`
and the byte tensors' (de)serializers, are pb_types.py's, exported here as
the same objects, so a model's ``isinstance`` checks hold either way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from appliance.core.sequences import FLAG_END, FLAG_START
from appliance.errors import ApplianceError
from appliance.runtimes import bls, custom_metrics

# Triton's names, exported as its module exports them.
from appliance.runtimes.pb_config import TRITON_STRING_TO_NUMPY as TRITON_STRING_TO_NUMPY
from appliance.runtimes.pb_config import ModelConfig as ModelConfig
from appliance.runtimes.pb_config import numpy_to_triton_type as numpy_to_triton_type
from appliance.runtimes.pb_config import triton_string_to_numpy as triton_string_to_numpy
from appliance.runtimes.pb_config import triton_to_numpy_type as triton_to_numpy_type
from appliance.runtimes.pb_types import InferenceResponse as InferenceResponse
from appliance.runtimes.pb_types import Tensor as Tensor
from appliance.runtimes.pb_types import TritonError as TritonError
from appliance.runtimes.pb_types import TritonModelException as TritonModelException
from appliance.runtimes.pb_types import deserialize_bytes_tensor as deserialize_bytes_tensor
from appliance.runtimes.pb_types import json_text
from appliance.runtimes.pb_types import serialize_byte_tensor as serialize_byte_tensor

log = logging.getLogger("appliance.model")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = FLAG_START
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = FLAG_END
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class InferenceResponseSender:
    """A decoupled model's way to answer a request: zero or more responses, then the final flag.

    ``send`` may be called from any thread, during ``execute`` or after it
    returned; the request's input tensors stay valid until the final flag.
    """

    def __init__(
        self,
        deliver: Callable[[InferenceResponse | None, int], None],
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self._deliver = deliver
        self._cancelled = cancelled
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Send ``response`` (None: no data, with the final flag alone).

        Raises:
            TritonModelException: the final flag was sent already, or neither a
                response nor the final flag was given.
        """
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if response is None and not flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                raise TritonModelException(
                    "send: give a response, or flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL"
                )
            if response is not None and not isinstance(response, InferenceResponse):
                raise TritonModelException(
                    f"send: expected an InferenceResponse, got {type(response).__name__}"
                )
            self._closed = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            self._deliver(response, flags)

    def is_cancelled(self) -> bool:
        return bool(self._cancelled and self._cancelled())


class InferenceRequest:
    """A request ``execute`` gets; made by the runtime from what arrived.

    Args:
        inputs: the request's tensors.
        request_id: the client's id for the request ("" when it sent none).
        correlation_id: the sequence's id (0 outside a sequence).
        requested_output_names: what the client asked for (all outputs when
            it named none).
        parameters: the request's parameters.
        flags: TRITONSERVER_REQUEST_FLAG_* of a sequence's step.
        model_name: the model it is for.
        cancelled: tells whether the client gave up on it.
    """

    def __init__(
        self,
        inputs: Iterable[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        requested_output_names: Iterable[str] = (),
        parameters: Mapping[str, Any] | str | None = None,
        flags: int = 0,
        model_name: str | bytes = "",
        model_version: int = -1,
        timeout: int = 0,
        cancelled: Callable[[], bool] | None = None,
        response_sender: InferenceResponseSender | None = None,
        **_unused: Any,
    ) -> None:
        self._sender = response_sender
        self._inputs = list(inputs)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._outputs = list(requested_output_names)
        # As given (a dict or JSON text): made JSON only when asked for.
        self._parameters: Mapping[str, Any] | str = parameters or {}
        self._flags = flags
        # Triton takes the name as bytes too (a BYTES input's element, often).
        self._model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self._model_version = model_version
        self._timeout = timeout
        self._cancelled = cancelled

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def parameters(self) -> str:
        """The request's parameters as a JSON object's text."""
        return json_text(self._parameters)

    def timeout(self) -> int:
        return self._timeout

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def trace(self) -> InferenceTrace:
        """The request's trace, for a BLS request made from it (``trace=``)."""
        return InferenceTrace()

    def set_release_flags(self, flags: int) -> None:
        """Triton's request release: only releasing it (RELEASE_ALL) is served here.

        Raises:
            TritonModelException: TRITONSERVER_REQUEST_RELEASE_RESCHEDULE.
        """
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "set_release_flags: rescheduling a request (TRITONSERVER_REQUEST_RELEASE_"
                "RESCHEDULE, Triton's iterative sequences) is not served here; answer the "
                "request, and keep per-sequence work in the model by correlation_id()"
            )

    def model_name(self) -> str:
        return self._model_name

    def is_cancelled(self) -> bool:
        return bool(self._cancelled and self._cancelled())

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender: only a decoupled model's requests have a response sender "
                "(model_transaction_policy { decoupled: true } in its config)"
            )
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (BLS): its InferenceResponse, or (a
        decoupled model) an iterator of them ending with an empty final one."""
        return ResponseIterator(bls.stream(self)) if decoupled else bls.infer(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """:meth:`exec` in ``async def execute``: other calls run while this one waits
        (a decoupled model's responses come as a list, once its stream ended)."""
        if decoupled:
            return [response async for response in bls.stream_async(self)]
        return await bls.infer_async(self)


class ResponseIterator:
    """A decoupled model's responses to a BLS request (``exec(decoupled=True)``), the
    empty final one last; ``cancel()`` ends the call's stream early."""

    def __init__(self, responses: Iterator[InferenceResponse]) -> None:
        self._responses = responses

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        return next(self._responses)

    def cancel(self) -> None:
        close = getattr(self._responses, "close", None)
        if close is not None:
            close()


class PreferredMemory:
    """Where a BLS call's outputs should be (``preferred_memory=``): here they are
    always copied into host memory, as Triton's CPU default puts them."""

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class MemoryType:
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class InferenceTrace:
    """A request's trace as Triton's Python models pass it on (``request.trace()``)."""

    def get_context(self) -> str | None:
        return None


def load_model(model_name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> None:
    """(Re)load a model (Triton's model loading API); return once it serves.

    ``config``: Triton's model-config JSON over the model's own; ``files``:
    ``"file:<path>"`` -> its bytes, the model's files (``config`` is then needed).

    Raises:
        TritonModelException: it was refused or did not become ready.
    """
    try:
        bls.load_model(model_name, config, files)
    except ApplianceError as ex:
        raise TritonModelException(ex.message) from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Stop serving a model (``unload_dependents`` has no meaning here: an ensemble
    has no instances of its own to unload).

    Raises:
        TritonModelException: it is not served, or a reload is running.
    """
    try:
        bls.unload_model(model_name)
    except ApplianceError as ex:
        raise TritonModelException(ex.message) from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bls.is_model_ready(model_name, model_version)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    return next((c for c in model_config.get("input", ()) if c.get("name") == name), None)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    return next((c for c in model_config.get("output", ()) if c.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class MetricFamily:
    """A family of the model's own metrics, shown on /metrics as Triton shows them.

    ``MetricFamily(name, description, kind)``, then ``family.Metric(labels={...})``
    (a histogram's with ``buckets=[...]``): ``increment`` (counter, gauge),
    ``set`` (gauge), ``observe`` (histogram), ``value``.
    """

    COUNTER = custom_metrics.COUNTER
    GAUGE = custom_metrics.GAUGE
    HISTOGRAM = custom_metrics.HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        try:
            custom_metrics.family(name, description, kind)
        except custom_metrics.MetricError as ex:
            raise TritonModelException(str(ex)) from None
        self._name, self._description, self._kind = name, description, kind

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        return Metric(self, labels, buckets)


class Metric:
    """One labelled series of a :class:`MetricFamily`; its misuse raises TritonModelException."""

    def __init__(
        self,
        family: MetricFamily,
        labels: Mapping[str, str] | None = None,
        buckets: Sequence[float] | None = None,
    ) -> None:
        self._metric = _metric_call(
            custom_metrics.Metric,
            family._name,
            family._kind,
            family._description,
            labels,
            buckets,
        )

    def increment(self, value: float) -> None:
        _metric_call(self._metric.increment, value)

    def set(self, value: float) -> None:
        _metric_call(self._metric.set, value)

    def observe(self, value: float) -> None:
        _metric_call(self._metric.observe, value)

    def value(self) -> float:
        return float(self._metric.value())


def _metric_call(function: Callable[..., Any], *args: Any) -> Any:
    try:
        return function(*args)
    except custom_metrics.MetricError as ex:
        raise TritonModelException(str(ex)) from None


class Logger:
    """Triton's model logger: lines go to the appliance's log, named by the model."""

    class LogLevel:
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3

    _LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        log.log(Logger._LEVELS.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        log.debug("%s", message)


class MetricKind:
    COUNTER = MetricFamily.COUNTER
    GAUGE = MetricFamily.GAUGE
    HISTOGRAM = MetricFamily.HISTOGRAM
