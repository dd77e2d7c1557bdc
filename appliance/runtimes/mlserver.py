"""MLServer's runtimes (``MLModel`` subclasses), hosted unmodified in a model worker.

A ``model-settings.json`` (mlserver_settings.py) names its runtime class in
``implementation``: one of MLServer's (``mlserver_sklearn.SKLearnModel``,
``mlserver_xgboost.XGBoostModel``, ``mlserver_lightgbm.LightGBMModel``) or
the user's own (``models.MyModel`` from a models.py beside the settings).
The worker drives it as MLServer does:

- ``load``: the settings are read by MLServer's own loader (defaults, the
  uri relative to the file, pydantic's checks), the class is imported the
  way MLServer imports it (the settings' folder on sys.path while it
  imports), instantiated with the settings, and ``await model.load()``
  runs; False, as in MLServer, leaves the model not ready.
- each request: its tensors become an MLServer ``InferenceRequest`` (data as
  MLServer's servers build it: flat lists, BYTES as str, as its REST server
  gives them, or bytes where they are not UTF-8, as its gRPC server; the request's
  parameters and each input's, so ``content_type`` picks MLServer's codec), the
  model's ``predict`` answers with an ``InferenceResponse``, and each output
  is read back into an array by its datatype and shape, with its parameters
  (its ``content_type``), which KServe responses carry.
- a class with its own ``predict_stream`` streams: one request is its
  payloads, each InferenceResponse it yields a part (KServe gRPC
  ModelStreamInfer's responses).
- metadata: the model's ``metadata()`` (the settings' inputs and outputs and
  their content types) is listed by KServe's metadata, never checked.
- errors: worded as MLServer's inference pool words them ("<module>.<class>:
  <message>", after the model's name); an ``MLServerError`` keeps its kind
  (400 -> BadRequest, 404 -> ModelNotFound, others -> ModelFailed), any other
  exception is ModelFailed (HTTP 500, gRPC INTERNAL, as MLServer answers it).
  Either fails its request alone; the instance keeps serving.
- ``unload``: ``await model.unload()``.

mlserver is an optional extra (``pip install 'appliance[mlserver]'``):
without it the model fails to load with that line, and the rest serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from appliance.core import dtypes
from appliance.core.dtypes import DType
from appliance.core.http_body import INPUT_PARAMETERS
from appliance.errors import ApplianceError, BadRequest, ModelFailed, ModelNotFound
from appliance.formats.mlserver.settings import ADAPTIVE
from appliance.model import Arrays, Outputs, OutputsWithParameters, Request
from appliance.runtimes.interface import (
    ModelFileError,
    RuntimeModel,
    exception_text,
    first_lines,
    text_or_bytes,
)

log = logging.getLogger("appliance.worker")

EXTRA = "pip install 'appliance[mlserver]'"
# MLServer's own runtimes, and the extra that brings each.
RUNTIME_EXTRAS = {
    "mlserver_sklearn": EXTRA,
    "mlserver_lightgbm": EXTRA,
    "mlserver_xgboost": "pip install 'appliance[mlserver-xgboost]'",
}
_BY_STATUS: dict[int, type[ApplianceError]] = {400: BadRequest, 404: ModelNotFound}


class MLServerModel(RuntimeModel):
    """An MLServer ``MLModel`` named by a model-settings.json."""

    # One InferenceRequest per client request, as MLServer calls predict.
    per_request = True
    inputs = None
    outputs = None

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.model_name = str(options.get("model_name") or self.path.parent.name)
        self.file_name = f"{self.path.parent.name}/{self.path.name}"
        self._model: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._types: Any = None

    def load(self) -> None:
        """Read the settings with MLServer's loader, import the class, ``await load()``.

        Raises:
            ModelFileError: mlserver or the runtime's package is not installed,
                the settings do not validate, the class cannot be imported, or
                its ``load`` raised or returned False.
        """
        try:
            loader = importlib.import_module("mlserver.repository.load")
            self._types = importlib.import_module("mlserver.types")
        except ImportError:
            raise ModelFileError(
                f"{self.file_name}: MLServer is not installed, and it runs this model ({EXTRA})"
            ) from None
        try:
            settings = loader.load_model_settings(str(self.path))
        except Exception as ex:
            raise ModelFileError(f"{self.file_name}: {self._short(first_lines(ex))}") from None
        self.platform = settings.platform
        cls = self._import(settings)
        try:
            model = cls(settings)
        except Exception as ex:
            raise ModelFileError(
                f"{self.file_name}: {cls.__name__}() raised {exception_text(ex)}"
            ) from None
        self._loop = asyncio.new_event_loop()
        try:
            with self._context(settings):
                ready = self._loop.run_until_complete(model.load())
        except Exception as ex:
            raise ModelFileError(
                f"{self.file_name}: {cls.__name__}.load raised {self._short(exception_text(ex))}"
            ) from None
        if ready is False:
            raise ModelFileError(f"{self.file_name}: {cls.__name__}.load returned False")
        model.ready = True
        self._model = model
        self.listed_metadata = self._metadata()
        self.description = f"MLServer {settings.implementation_} ({self.file_name})"

    def _metadata(self) -> dict[str, Any]:
        """What MLServer's metadata endpoint lists of the model (its ``metadata()``: the
        settings' inputs and outputs, and their content types), for KServe's metadata."""
        assert self._loop is not None
        try:
            with self._context(self._model.settings):
                found = self._loop.run_until_complete(self._model.metadata()).model_dump()
        except Exception as ex:
            log.error("model %s: metadata() raised %s", self.model_name, exception_text(ex))
            return {}
        return {key: found[key] for key in ("inputs", "outputs", "parameters") if key in found}

    def supported(self) -> dict[str, bool]:
        """``predict_stream`` is served where the runtime's class defines its own."""
        streams = False
        if self._model is not None:
            mlmodel = importlib.import_module("mlserver").MLModel
            streams = type(self._model).predict_stream is not mlmodel.predict_stream
        return {**self.supports(), "predict_stream": streams}

    def _short(self, message: str) -> str:
        """A message with the repository's path left out: a status note holds 256 bytes."""
        return message.replace(f"{self.path.parent.parent}/", "")

    def _import(self, settings: Any) -> Any:
        """The implementation class, imported by MLServer's settings (its sys.path rule)."""
        name = str(settings.implementation_)
        try:
            return settings.implementation
        except ModuleNotFoundError as ex:
            package = (ex.name or "").split(".")[0]
            hint = RUNTIME_EXTRAS.get(package)
            if hint is not None:
                raise ModelFileError(
                    f"{self.file_name}: implementation {name}: {package} is not installed ({hint})"
                ) from None
            raise ModelFileError(
                f"{self.file_name}: implementation {name} cannot be imported: "
                f"{self._short(exception_text(ex))}"
            ) from None
        except Exception as ex:
            raise ModelFileError(
                f"{self.file_name}: implementation {name} cannot be imported: "
                f"{self._short(exception_text(ex))}"
            ) from None

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        """One request alone (the worker calls predict_requests; this marks predict served)."""
        result = self._predict(Request(inputs, parameters, None))
        if isinstance(result, ApplianceError):
            raise result
        return result

    def predict_stream(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Iterator[Outputs]:
        """The runtime's ``predict_stream`` over this one request: each InferenceResponse
        it yields is a part (KServe gRPC ModelStreamInfer sends one response per part).

        Raises:
            BadRequest: a parameter of the wrong type (before the stream opens).
        """
        try:
            payload = self._payload(Request(inputs, parameters, None))
        except ValueError as ex:
            raise BadRequest(f"model {self.model_name}: {first_lines(ex)}") from None
        return self._stream(payload)

    def _stream(self, payload: Any) -> Iterator[Outputs]:
        loop = self._loop
        assert loop is not None

        async def payloads() -> AsyncIterator[Any]:
            yield payload

        responses = self._model.predict_stream(payloads())
        try:
            while True:
                try:
                    with self._context(self._model.settings):
                        response = loop.run_until_complete(anext(responses))
                except StopAsyncIteration:
                    return
                except Exception as ex:
                    raise self._error(ex) from None
                outputs = self._outputs(response, "predict_stream must yield")
                if isinstance(outputs, ApplianceError):
                    raise outputs
                yield outputs
        finally:
            # The client went away or the stream ended: let the runtime clean up.
            if not loop.is_closed():
                with contextlib.suppress(Exception):
                    loop.run_until_complete(responses.aclose())

    def predict_requests(self, requests: Sequence[Request]) -> list[Outputs | ApplianceError]:
        """Answer each request with the model's ``predict``; an error fails it alone.

        With adaptive batching (max_batch_size and max_batch_time in its settings) the
        batch's requests are merged into one and its response split, by MLServer's own
        BatchedRequests, as MLServer's adaptive batcher does; an error fails them all.
        """
        if not self.options.get(ADAPTIVE) or len(requests) < 2:
            return [self._predict(request) for request in requests]
        try:
            payloads = {str(index): self._payload(r) for index, r in enumerate(requests)}
        except ValueError as ex:
            return [BadRequest(f"model {self.model_name}: {first_lines(ex)}")] * len(requests)
        # MLServer's own merging and splitting, as its adaptive batcher uses them.
        batched = importlib.import_module("mlserver.batching.requests").BatchedRequests(payloads)
        response = self._answer(batched.merged_request)
        if isinstance(response, ApplianceError):
            return [response] * len(requests)
        try:
            parts = batched.split_response(response)
        except Exception as ex:
            failed = ModelFailed(f"model {self.model_name}: {exception_text(ex)}")
            return [failed] * len(requests)
        missing = ModelFailed(f"model {self.model_name}: the batch's response left a request out")
        return [self._outputs(parts[key]) if key in parts else missing for key in payloads]

    def _predict(self, request: Request) -> Outputs | ApplianceError:
        try:
            payload = self._payload(request)
        except ValueError as ex:  # pydantic's ValidationError: a parameter of the wrong type
            return BadRequest(f"model {self.model_name}: {first_lines(ex)}")
        response = self._answer(payload)
        if isinstance(response, ApplianceError):
            return response
        return self._outputs(response)

    def _answer(self, payload: Any) -> Any:
        """The model's InferenceResponse to ``payload``, or the error it answers with."""
        assert self._loop is not None
        try:
            with self._context(self._model.settings):
                response = self._loop.run_until_complete(self._model.predict(payload))
        except Exception as ex:
            return self._error(ex)
        if response is None:
            # MLServer's inference pool answers a None with an InferenceError (400).
            return BadRequest(
                f"model {self.model_name}: Model '{self._model.name}' returned no predictions "
                "after inference"
            )
        return response

    def _outputs(
        self, response: Any, what: str = "predict must return"
    ) -> Outputs | ApplianceError:
        """The response's outputs as arrays, with each output's parameters (its
        ``content_type``, ...) and the response's own, which the KServe responses
        carry as MLServer's do. (MLServer turns the response's ``headers``
        parameter into HTTP headers; here it is left out.)"""
        try:
            arrays = {output.name: _array(output) for output in response.outputs}
            parameters = {
                output.name: output.parameters.model_dump()
                for output in response.outputs
                if output.parameters is not None
            }
            said = response.parameters.model_dump() if response.parameters is not None else {}
            said.pop("headers", None)
            if parameters or any(value is not None for value in said.values()):
                return OutputsWithParameters(arrays, parameters, said)
            return arrays
        except (AttributeError, ValueError, TypeError, KeyError) as ex:
            return ModelFailed(
                f"model {self.model_name}: {what} an InferenceResponse whose "
                f"outputs fit their datatype and shape: {exception_text(ex)}"
            )

    def unload(self) -> None:
        try:
            if self._model is not None and self._loop is not None:
                self._loop.run_until_complete(self._model.unload())
        except Exception as ex:
            log.error("model %s: unload raised %s", self.model_name, exception_text(ex))
        finally:
            if self._loop is not None:
                self._loop.close()

    # -- requests and responses ------------------------------------------------

    def _payload(self, request: Request) -> Any:
        types = self._types
        parameters = dict(request.parameters)
        per_input = parameters.pop(INPUT_PARAMETERS, None)
        per_input = per_input if isinstance(per_input, dict) else {}
        inputs = [
            types.RequestInput(
                name=name,
                shape=list(array.shape),
                datatype=_datatype(array),
                data=_data(array),
                parameters=types.Parameters(**per_input[name]) if per_input.get(name) else None,
            )
            for name, array in request.inputs.items()
        ]
        outputs = None
        if request.outputs is not None:
            outputs = [types.RequestOutput(name=name) for name in request.outputs]
        return types.InferenceRequest(
            id=request.request_id or None,
            parameters=types.Parameters(**parameters) if parameters else None,
            inputs=inputs,
            outputs=outputs,
        )

    def _error(self, ex: Exception) -> ApplianceError:
        """The error as MLServer words one from its inference pool (its default,
        parallel_workers 1: WorkerError), "<module>.<class>: <message>", after the model."""
        status = getattr(ex, "status_code", None)
        kind = type(ex)
        message = f"model {self.model_name}: {kind.__module__}.{kind.__name__}: {ex}"
        if isinstance(status, int):
            return _BY_STATUS.get(status, ModelFailed)(message)
        return ModelFailed(message)

    @contextlib.contextmanager
    def _context(self, settings: Any) -> Iterator[None]:
        """MLServer's model context (its custom metrics and logs read it)."""
        try:
            context = importlib.import_module("mlserver.context")
        except ImportError:
            yield
            return
        with context.model_context(settings):
            yield


def _datatype(array: np.ndarray[Any, Any]) -> str:
    if array.dtype.kind in "OSU":
        return DType.BYTES.value
    return dtypes.from_numpy(array.dtype).value


def _data(array: np.ndarray[Any, Any]) -> list[Any]:
    """The elements as a flat list, as MLServer's servers give them to a runtime.

    BYTES: MLServer's REST server gives JSON strings (str), its gRPC server
    bytes. Text goes as str, so that a runtime written against REST (most
    are: MLServer's examples post JSON) sees what it expects; bytes that are
    not UTF-8 could only have come over gRPC, and stay bytes.
    """
    flat = array.reshape(-1)
    if array.dtype.kind == "O":
        return [text_or_bytes(bytes(item)) for item in flat]
    return list(flat.tolist())


def _array(output: Any) -> np.ndarray[Any, Any]:
    """A response output as an array of its datatype and shape."""
    data = getattr(output.data, "root", output.data)
    shape = [int(d) for d in output.shape]
    if output.datatype == DType.BYTES.value:
        items = data if isinstance(data, list) else [data]
        flat = _flatten(items)
        encoded = [item.encode() if isinstance(item, str) else bytes(item) for item in flat]
        array = np.empty(len(encoded), dtype=object)
        array[:] = encoded
        return array.reshape(shape)
    dtype = dtypes.to_numpy(DType(output.datatype))
    if isinstance(data, bytes):
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    return np.asarray(data, dtype=dtype).reshape(shape)


def _flatten(items: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for item in items:
        if isinstance(item, list | tuple):
            flat += _flatten(list(item))
        else:
            flat.append(item)
    return flat
