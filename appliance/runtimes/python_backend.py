"""Triton's Python backend: a ``model.py`` defining ``TritonPythonModel``, served unmodified.

A repository model whose config.pbtxt says ``backend: "python"`` (or whose
config.toml says ``platform = "python"``) is a version directory's
``model.py`` (or ``default_model_filename``). The model worker serves it the
way Triton's Python stub does:

- ``load``: ``triton_python_backend_utils`` is this package's own
  (python_backend_utils.py); the model's version and model directories go on
  ``sys.path`` and the file is imported as ``<version>.<file>``, as Triton
  imports it; ``TritonPythonModel.auto_complete_config`` (a static method,
  when defined) completes the config, which then declares the tensors and
  max_batch_size; ``initialize(args)`` runs with Triton's args.
- each batch: ``execute`` gets the batch's requests as a list (never
  concatenated), input tensors as read-only views of the shared memory they
  arrived in, and must return one ``InferenceResponse`` per request, in order.
  A response with an error fails its request alone; a wrong count, or a
  response that is not one, fails the batch's requests, not the instance.
- ``unload`` (the instance stops): ``finalize()``.

- a sequence model (config.pbtxt's ``sequence_batching``): every step of a
  sequence reaches the same instance; its request's ``correlation_id()`` and
  ``flags()`` are the sequence's id and start/end flags, and its inputs hold
  the control inputs (and any implicit state, which Triton's own Python
  backend does not carry) the worker fills.
- a decoupled model (``model_transaction_policy { decoupled: true }``):
  each request goes to ``execute`` alone with a response sender, and what it
  sends (from any thread) streams back until the final flag; such a model is
  served over streams only (KServe gRPC ModelStreamInfer), as in Triton.

Calls to other models (BLS: ``InferenceRequest(...).exec()``, ``async_exec``
in an ``async def execute``, which runs in the instance's own event loop) go
through the model worker's own client (bls.py).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from appliance.config import device as devices
from appliance.core.tensor import TensorSpec
from appliance.errors import (
    ApplianceError,
    BadRequest,
    ModelFailed,
    ModelNotFound,
    ModelNotReady,
    Unsupported,
)
from appliance.model import Arrays, Outputs, OutputsWithParameters, Request
from appliance.runtimes import custom_metrics
from appliance.runtimes import python_backend_utils as pb_utils
from appliance.runtimes.interface import ModelFileError, RuntimeModel, parse_dtype

log = logging.getLogger("appliance.worker")

MODULE_NAME = "triton_python_backend_utils"
# Triton copies inputs into its stub, so a model.py may write into them; here
# they are views of the request's shared memory, which no model may change.
READ_ONLY_HINT = (
    " (input tensors are read-only views of the request's shared memory: copy one "
    "before writing into it, e.g. np.array(tensor.as_numpy()))"
)
_ERRORS: dict[int, type[ApplianceError]] = {
    pb_utils.TritonError.INVALID_ARG: BadRequest,
    pb_utils.TritonError.NOT_FOUND: ModelNotFound,
    pb_utils.TritonError.UNAVAILABLE: ModelNotReady,
    pb_utils.TritonError.UNSUPPORTED: Unsupported,
}


class PythonBackendModel(RuntimeModel):
    """A Triton Python-backend model: ``model.py``'s ``TritonPythonModel``."""

    per_request = True
    platform = "python"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.model_name = self.path.parent.parent.name
        self._instance: Any = None
        self.decoupled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def load(self) -> None:
        """Import model.py, complete and read the config, then ``initialize``.

        Raises:
            ModelFileError: model.py cannot be imported, has no TritonPythonModel,
                its auto_complete_config or initialize raised, or the config
                declares no inputs or outputs.
        """
        sys.modules[MODULE_NAME] = pb_utils
        config = self.triton_config()
        cls = self._model_class()
        complete = getattr(cls, "auto_complete_config", None)
        if complete is not None:
            completed = self._call("auto_complete_config", complete, pb_utils.ModelConfig(config))
            if not isinstance(completed, pb_utils.ModelConfig):
                raise ModelFileError(
                    f"{self.file_name}: auto_complete_config must return the "
                    "pb_utils.ModelConfig it was given"
                )
            config = completed.as_dict()
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.config = config
        self._declare(config)
        instance = self._call("TritonPythonModel()", cls)
        initialize = getattr(instance, "initialize", None)
        if initialize is not None:
            self._call("initialize", initialize, self._args(config))
        self._instance = instance
        if not self.description:
            self.description = f"Triton Python model {self.model_name} ({self.file_name})"

    def predict_requests(self, requests: Sequence[Request]) -> list[Outputs | ApplianceError]:
        """Run ``execute`` on the batch's requests; one result per request, in order."""
        wrapped = [self._request(request) for request in requests]
        try:
            responses = self._awaited(self._instance.execute(wrapped))
        except Exception as ex:
            hint = READ_ONLY_HINT if "read-only" in str(ex) else ""
            raise ModelFailed(
                f"model {self.model_name}: execute raised {_last_line(ex)}{hint}"
            ) from ex
        if not isinstance(responses, list | tuple) or len(responses) != len(wrapped):
            count = len(responses) if isinstance(responses, list | tuple) else type(responses)
            raise ModelFailed(
                f"model {self.model_name}: execute returned {count} responses for "
                f"{len(wrapped)} requests (one InferenceResponse per request, in order)"
            )
        return [self._result(response) for response in responses]

    def supported(self) -> dict[str, bool]:
        # A decoupled model answers through its response sender: over a stream only.
        # (predict_requests, not predict, answers the other kind.)
        return {**self.supports(), "predict": not self.decoupled, "predict_stream": self.decoupled}

    def predict_stream(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Iterator[Outputs]:
        return self.predict_stream_request(Request(inputs, parameters, None))

    def predict_stream_request(self, request: Request) -> Iterator[Outputs]:
        """A decoupled model's answers to one request, as its response sender sends them.

        ``execute`` gets the request with a sender and returns None; each
        response sent (from any thread) is one part, until the final flag. A
        response with an error ends the stream with that error.
        """
        parts: queue.SimpleQueue[tuple[pb_utils.InferenceResponse | None, int]]
        parts = queue.SimpleQueue()
        # Set once the stream is closed before its final flag (the client cancelled
        # it or went away): the model sees is_cancelled() and may stop generating.
        gave_up = threading.Event()
        sender = pb_utils.InferenceResponseSender(
            lambda r, flags: parts.put((r, flags)), gave_up.is_set
        )
        wrapped = self._request(request, sender, gave_up.is_set)
        try:
            returned = self._awaited(self._instance.execute([wrapped]))
        except Exception as ex:
            raise ModelFailed(f"model {self.model_name}: execute raised {_last_line(ex)}") from ex
        if returned is not None:
            raise ModelFailed(
                f"model {self.model_name}: a decoupled model's execute must return None "
                f"(it answers through request.get_response_sender()), not "
                f"{type(returned).__name__}"
            )
        final = False
        try:
            while not final:
                response, flags = parts.get()
                final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                if response is None:
                    continue
                result = self._result(response)
                if isinstance(result, ApplianceError):
                    raise result
                yield result
        finally:
            if not final:
                gave_up.set()

    def unload(self) -> None:
        finalize = getattr(self._instance, "finalize", None)
        try:
            if finalize is not None:
                finalize()
        except Exception as ex:
            log.error("model %s: finalize raised %s", self.model_name, _last_line(ex))
        finally:
            if self._loop is not None:
                self._loop.close()
            custom_metrics.close()

    def _awaited(self, returned: Any) -> Any:
        """What ``execute`` returned, once done: an ``async def execute`` (one that
        awaits ``async_exec`` calls) runs to its end in this instance's event loop."""
        if not inspect.iscoroutine(returned):
            return returned
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(returned)

    # -- load ------------------------------------------------------------------

    def triton_config(self) -> dict[str, Any]:
        """The model's config as Triton's JSON, as ``initialize`` gets it in ``args``."""
        if self.pbtxt:
            from appliance.formats.triton import (
                config_pbtxt as pbtxt,  # a protobuf parser: only for a config.pbtxt
            )

            config = pbtxt.as_json(self.path.parent.parent / pbtxt.FILE)
        else:
            batch = int(self.options.get("max_batch_size", 0))
            config = {
                "max_batch_size": batch,
                "input": _tables(self.options.get("inputs"), batch > 0),
                "output": _tables(self.options.get("outputs"), batch > 0),
            }
        config["name"] = self.model_name
        config.setdefault("backend", "python")
        return config

    def _model_class(self) -> Any:
        version_dir, model_dir = self.path.parent, self.path.parent.parent
        for directory in (str(version_dir), str(model_dir)):
            if directory not in sys.path:
                sys.path.append(directory)
        name = f"{version_dir.name}.{self.path.stem}"
        sys.modules.pop(name, None)
        try:
            module = importlib.import_module(name)
        except Exception as ex:
            raise ModelFileError(f"{self.file_name} failed to import: {_last_line(ex)}") from None
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            raise ModelFileError(f"{self.file_name} defines no class TritonPythonModel")
        return cls

    def _call(self, what: str, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except Exception as ex:
            raise ModelFileError(f"{self.file_name}: {what} raised {_last_line(ex)}") from None

    def _declare(self, config: Mapping[str, Any]) -> None:
        batch = int(config.get("max_batch_size", 0))
        rows = (-1,) if batch > 0 else ()
        specs = {}
        for kind in ("input", "output"):
            tables = list(config.get(kind) or ())
            if not tables:
                raise ModelFileError(
                    f"{self.config_name}: no {kind}s declared (in config.pbtxt, or by the "
                    "model's auto_complete_config)"
                )
            specs[kind] = [
                TensorSpec(
                    str(table["name"]),
                    parse_dtype(str(table["data_type"]), f"{self.config_name}: {table['name']}"),
                    (*rows, *(int(d) for d in table.get("dims", ()))),
                    kind == "input" and bool(table.get("optional", False)),
                )
                for table in tables
            ]
        # A sequence model's requests carry its control inputs and state too, as
        # Triton's sequence batcher adds them; the state it returns is kept.
        implicit_in, implicit_out = self.implicit_specs(batch > 0)
        named = {spec.name for spec in specs["output"]}
        specs["input"] += implicit_in
        specs["output"] += [spec for spec in implicit_out if spec.name not in named]
        self.declare(specs["input"], specs["output"])
        self.max_batch_size = batch

    def _args(self, config: Mapping[str, Any]) -> dict[str, str]:
        gpu = devices.is_cuda(self.device)
        return {
            "model_config": json.dumps(config),
            "model_instance_kind": "GPU" if gpu else "CPU",
            # Triton's: the instance group's name (<model>_0) and the instance's index.
            "model_instance_name": f"{self.model_name}_0_{self.instance}",
            "model_instance_device_id": self.device.partition(":")[2] if gpu else "0",
            "model_repository": str(self.path.parent.parent),
            "model_version": self.version,
            "model_name": self.model_name,
        }

    # -- requests and responses ------------------------------------------------

    def _request(
        self,
        request: Request,
        sender: pb_utils.InferenceResponseSender | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> pb_utils.InferenceRequest:
        inputs = [pb_utils.Tensor(name, array) for name, array in request.inputs.items()]
        wanted = (
            request.outputs if request.outputs is not None else [s.name for s in self.outputs or ()]
        )
        return pb_utils.InferenceRequest(
            inputs=inputs,
            request_id=request.request_id,
            correlation_id=request.correlation_id,
            requested_output_names=wanted,
            parameters=dict(request.parameters),
            flags=request.flags,
            model_name=self.model_name,
            response_sender=sender,
            cancelled=cancelled,
        )

    def _result(self, response: Any) -> Outputs | ApplianceError:
        if not isinstance(response, pb_utils.InferenceResponse):
            return ModelFailed(
                f"model {self.model_name}: execute returned {type(response).__name__} where an "
                "InferenceResponse was due"
            )
        error = response.error()
        if error is not None:
            kind = _ERRORS.get(error.code(), ModelFailed)
            return kind(error.message())
        outputs = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
        try:
            said = response.parameters_given()
        except (ValueError, TypeError):
            return ModelFailed(
                f"model {self.model_name}: an InferenceResponse's parameters must be a dict "
                f"or a JSON object's text, got {response.parameters()!r:.80}"
            )
        # A response's parameters (newer Triton's InferenceResponse(parameters=...)).
        return OutputsWithParameters(outputs, {}, said) if said else outputs


def _tables(tables: Any, batched: bool) -> list[dict[str, Any]]:
    """config.toml's inputs or outputs as Triton's JSON tensors: ``dims`` leave
    out the batch dimension (the leading -1 of a batched model's shapes)."""
    converted = []
    for table in tables or ():
        shape = [int(d) for d in table.get("shape", ())]
        if batched and shape[:1] == [-1]:
            shape = shape[1:]
        converted.append(
            {
                "name": str(table["name"]),
                "data_type": "TYPE_" + str(table["dtype"]).replace("BYTES", "STRING"),
                "dims": shape,
                "optional": bool(table.get("optional", False)),
            }
        )
    return converted


def _last_line(ex: BaseException) -> str:
    """An exception as its traceback's last line says it: "ValueError: ..."."""
    return traceback.format_exception_only(type(ex), ex)[-1].strip()
