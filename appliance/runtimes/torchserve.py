"""TorchServe's handlers, hosted unmodified in a model worker.

An archive (formats/torchserve/archive.py) names its handler in its
manifest: a module of the archive (``handler.py``, or ``handler.py:fn`` for
a function), else one of TorchServe's built-in handlers by name. The worker
loads it as TorchServe's does:

- ``load``: a ``.mar`` is unpacked into a directory of its own (removed at
  unload), which goes on ``sys.path``; ``ts`` is TorchServe's own package where
  installed, else the appliance's (ts_surface/). A module-level function
  (``handle`` unless the manifest names another) is called once with
  ``data=None`` to initialize; else the module's one class is instantiated
  and its ``initialize(context)`` called.
- each batch (``batchSize`` requests at most, from every protocol): the
  handler gets one ``data`` item per request (torchserve_io.py) and must
  return a list of as many items, each request's body. Failures answer the
  whole batch as TorchServe's worker does, with its words and status: an
  exception 503 "Prediction failed" (its traceback logged), a
  ``PredictionException`` its own message and code, ``MemoryError`` or a
  CUDA error 507 "Out of resources", a result that is not a list 503
  "Invalid model predict output", a list of another length 503 "number of
  batch response mismatched".
- ``context.set_response_status`` and the response headers a handler sets
  reach the client with its request's body.
- a handler that streams (its archive's Python calls
  ``send_intermediate_predict_response``) answers over a stream: each
  intermediate response is a part, its return value the last (HTTP sends
  them as chunks, KServe gRPC as ModelStreamInfer responses). Such a
  model takes one request at a time, as a decoupled Triton model does.
"""

from __future__ import annotations

import importlib
import logging
import queue
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from appliance.core.http_body import BODY
from appliance.errors import ApplianceError, ModelFailed
from appliance.formats.torchserve.archive import (
    ArchiveError,
    read_manifest,
    read_model_config,
    unpack,
)
from appliance.model import Arrays, Outputs, Request
from appliance.runtimes.interface import ModelFileError, RuntimeModel, exception_text
from appliance.runtimes.torchserve_io import (
    FrameSink,
    answer,
    encode,
    request_data,
    v2_outputs,
    v2_request,
)

log = logging.getLogger("appliance.worker")

# TorchServe's built-in handlers, by the name a manifest gives them, and what they need.
BUILT_IN = {
    "image_classifier": "torchvision",
    "image_segmenter": "torchvision",
    "object_detector": "torchvision",
    "text_classifier": "torchtext and captum",
    "densenet_handler": "torchvision",
}
FAILED = 503
OUT_OF_RESOURCES = 507
# TorchServe's request envelopes; the v2 one also takes KServe v2 tensors.
ENVELOPES = ("kserve", "kservev2")
KSERVE_V2 = "kservev2"
# The fields that carry a request's body (TorchServe's handlers read "data" or "body").
BODIES = {"body", "data"}
# What a handler that streams calls (ts.handler_utils.utils).
STREAMS = "send_intermediate_predict_response"

Entry = Callable[[Any, Any], Any]


class TorchServeModel(RuntimeModel):
    """A TorchServe archive, served by its handler."""

    per_request = True
    inputs = None
    outputs = None
    platform = "torchserve"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.model_name = str(options.get("model_name") or self.path.name)
        self.file_name = self.path.name
        self._unpacked: Path | None = None
        self._model_dir = ""
        self._entry: Entry | None = None
        self._context: Any = None
        self.streams = False
        # TorchServe's service_envelope for this archive ("" for none).
        self.envelope = str(options.get("envelope") or "")

    def load(self) -> None:
        """Unpack the archive, import its handler and initialize it.

        Raises:
            ModelFileError: the archive cannot be read, its handler cannot be
                imported, or initializing it raised.
        """
        try:
            self._load()
        except BaseException:
            self.unload()  # a failed load leaves no unpacked archive behind
            raise

    def _load(self) -> None:
        from appliance.runtimes.ts_surface import ensure_ts

        ensure_ts()
        try:
            manifest = read_manifest(self.path)
            settings = read_model_config(self.path, manifest)
            if not self.path.is_dir():
                self._unpacked = Path(tempfile.mkdtemp(prefix=f"appliance-ts-{self.model_name}-"))
            model_dir = unpack(self.path, self._unpacked or self.path)
        except ArchiveError as ex:
            raise ModelFileError(str(ex)) from None
        self._model_dir = str(model_dir)
        sys.path.insert(0, self._model_dir)
        model = manifest["model"]
        self.version = str(self.options.get("version") or model.get("modelVersion") or "1.0")
        ts = importlib.import_module("ts")
        context_module = importlib.import_module("ts.context")
        metrics = importlib.import_module("appliance.runtimes.ts_surface.ts.metrics.metric_cache")
        gpu = int(self.device.split(":")[1]) if self.device.startswith("cuda:") else None
        self._context = context_module.Context(
            self.model_name,
            self._model_dir,
            manifest,
            int(self.options.get("batch_size", 1)),
            gpu,
            getattr(ts, "__version__", "0.12.0"),
            True,
            metrics.MetricsCache(self.model_name),
            settings,
        )
        handler = str(model["handler"])
        entry, initialize = self._entry_point(handler)
        if self.envelope:
            entry = self._enveloped(entry)
        try:
            initialize(self._context)
        except Exception as ex:
            log.warning(
                "model %s: initializing handler %s failed", self.model_name, handler, exc_info=True
            )
            raise ModelFileError(
                f"{self.file_name}: handler {handler}: initialize raised {exception_text(ex)}"
            ) from None
        self._entry = entry
        self.streams = any(STREAMS in _text(path) for path in model_dir.rglob("*.py"))
        self.description = f"TorchServe handler {handler} ({self.file_name})"

    def _enveloped(self, entry: Entry) -> Entry:
        """The entry point inside TorchServe's envelope (its ``service_envelope``)."""
        try:
            module = importlib.import_module(f"ts.torch_handler.request_envelope.{self.envelope}")
        except ImportError:
            raise ModelFileError(
                f"{self.file_name}: no request envelope {self.envelope!r} "
                f"(TorchServe's: {', '.join(ENVELOPES)})"
            ) from None
        util = importlib.import_module("ts.utils.util")
        envelope = util.list_classes_from_module(module)[0]
        handle: Entry = envelope(entry).handle
        return handle

    def _entry_point(self, handler: str) -> tuple[Entry, Callable[[Any], Any]]:
        """The handler's entry point and what initializes it, as TorchServe's loader finds them."""
        module_name, _, function = handler.partition(":")
        module_name = module_name.removesuffix(".py").split("/")[-1]
        module = self._import(handler, module_name)
        function = function or "handle"
        if hasattr(module, function):
            entry = getattr(module, function)
            return entry, lambda context: entry(None, context)
        util = importlib.import_module("ts.utils.util")
        classes = util.list_classes_from_module(module)
        if len(classes) != 1:
            names = ", ".join(cls.__name__ for cls in classes) or "none"
            raise ModelFileError(
                f"{self.file_name}: handler {handler}: expected one class or a function "
                f"{function}() in it, found classes: {names}"
            )
        try:
            service = classes[0]()
        except Exception as ex:
            raise ModelFileError(
                f"{self.file_name}: handler {handler}: {classes[0].__name__}() raised "
                f"{exception_text(ex)}"
            ) from None
        if not hasattr(service, "handle"):
            raise ModelFileError(
                f"{self.file_name}: handler {handler}: {classes[0].__name__} has no handle method"
            )
        initialize = getattr(service, "initialize", lambda _context: None)
        return service.handle, initialize

    def _import(self, handler: str, module_name: str) -> Any:
        own = Path(self._model_dir, f"{module_name}.py").is_file()
        try:
            return importlib.import_module(module_name)
        except ImportError as ex:
            if own:
                raise ModelFileError(
                    f"{self.file_name}: handler {handler} cannot be imported: {exception_text(ex)}"
                ) from None
        except Exception as ex:
            raise ModelFileError(
                f"{self.file_name}: handler {handler} cannot be imported: {exception_text(ex)}"
            ) from None
        try:
            return importlib.import_module(f"ts.torch_handler.{module_name}")
        except ImportError:
            pass
        if module_name in BUILT_IN:
            raise ModelFileError(
                f"{self.file_name}: handler {handler}: TorchServe's built-in handler "
                f"{module_name} is not served by the appliance (it needs "
                f"{BUILT_IN[module_name]}); give the archive a handler file of its own"
            )
        raise ModelFileError(
            f"{self.file_name}: handler {handler}: no {module_name}.py in the archive, "
            "and no built-in handler of that name"
        )

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        """One request alone (the worker calls predict_requests; this marks predict served)."""
        result = self.predict_requests([Request(inputs, parameters, None)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def supported(self) -> dict[str, bool]:
        # A handler that streams answers over a stream only (as a decoupled model).
        return {**self.supports(), "predict": not self.streams, "predict_stream": self.streams}

    def predict_stream_request(self, request: Request) -> Iterator[Outputs]:
        """The handler's intermediate responses to one request, then its last.

        The handler runs on a thread of its own, so that each
        ``send_intermediate_predict_response`` reaches the client as it is
        sent; an error (the handler's, or its result's) ends the stream.
        """
        parts: queue.SimpleQueue[tuple[bool, Outputs | ApplianceError]] = queue.SimpleQueue()
        context = self._context

        def send(ret: Any, _ids: Any, _message: str, _code: int) -> None:
            if not isinstance(ret, list) or len(ret) != 1:
                raise ValueError("send_intermediate_predict_response: one item per request")
            status, reason = context.get_response_status(0)
            headers = context.get_response_headers(0)
            parts.put((False, answer(encode(ret[0]), status or 200, reason, headers)))

        def run() -> None:
            try:
                last = self.predict_requests([request])[0]
            except BaseException as ex:  # the stream must end, whatever happened
                last = self._failure(ex if isinstance(ex, Exception) else RuntimeError(str(ex)))
            parts.put((True, last))

        context.send_intermediate = send  # the appliance's own ts
        context.cl_socket = FrameSink(lambda part: parts.put((False, part)))  # TorchServe's
        threading.Thread(target=run, name="torchserve-stream", daemon=True).start()
        while True:
            done, part = parts.get()
            if isinstance(part, ApplianceError):
                raise part
            yield part
            if done:
                return

    def predict_requests(self, requests: Sequence[Request]) -> list[Outputs | ApplianceError]:
        """Hand the batch to the handler as one ``data`` list; each item answers one request."""
        assert self._entry is not None
        context = self._context
        data, processors, ids = [], [], {}
        request_processor = importlib.import_module("ts.context").RequestProcessor
        native: set[int] = set()
        for index, request in enumerate(requests):
            item, headers = request_data(request)
            if self.envelope == KSERVE_V2 and not BODIES & set(item):
                # KServe v2 tensors (from the appliance's own KServe frontends): the
                # envelope gets them as the v2 JSON it parses, and its answer goes back
                # as tensors.
                item = {BODY: v2_request(request)}
                native.add(index)
            data.append(item)
            processors.append(request_processor(headers))
            ids[index] = request.request_id or str(uuid.uuid4())
        context.request_ids = ids
        context.request_processor = processors
        context.metrics.set_request_ids(ids)
        started = time.time()
        try:
            ret = self._entry(data, context)
        except Exception as ex:
            return [self._failure(ex)] * len(requests)
        if not isinstance(ret, list):
            log.warning("model: %s, Invalid return type: %s.", self.model_name, type(ret))
            return [ModelFailed("Invalid model predict output", FAILED)] * len(requests)
        if len(ret) != len(data):
            log.warning(
                "model: %s, number of batch response mismatched, expect: %d, got: %d.",
                self.model_name,
                len(data),
                len(ret),
            )
            return [ModelFailed("number of batch response mismatched", FAILED)] * len(requests)
        # As TorchServe's backend times a batch that its handler answered.
        context.metrics.add_time("PredictionTime", round((time.time() - started) * 1000, 2))
        try:
            bodies = [None if index in native else encode(value) for index, value in enumerate(ret)]
        except TypeError:
            log.warning(
                "model %s: Unable to serialize model output.", self.model_name, exc_info=True
            )
            return [ModelFailed("Unsupported model output data type.", FAILED)] * len(requests)
        answers: list[Outputs | ApplianceError] = []
        for index, body in enumerate(bodies):
            if body is None:
                answers.append(self._tensors(ret[index]))
                continue
            status, reason = context.get_response_status(index)
            answers.append(answer(body, status or 200, reason, context.get_response_headers(index)))
        return answers

    def _tensors(self, response: Any) -> Outputs | ApplianceError:
        try:
            return v2_outputs(response)
        except (ValueError, KeyError, TypeError) as ex:
            log.warning("model %s: the kservev2 envelope's answer: %s", self.model_name, ex)
            return ModelFailed(f"model {self.model_name}: the kservev2 envelope's answer: {ex}")

    def _failure(self, ex: Exception) -> ModelFailed:
        """The batch's error, worded and numbered as TorchServe's worker answers it."""
        if isinstance(ex, MemoryError):
            log.error("model %s: System out of memory", self.model_name, exc_info=ex)
            return ModelFailed("Out of resources", OUT_OF_RESOURCES)
        if type(ex).__name__ == "PredictionException" and hasattr(ex, "error_code"):
            log.error("model %s: Prediction error", self.model_name, exc_info=ex)
            return ModelFailed(str(getattr(ex, "message", ex)), int(ex.error_code))
        if "CUDA" in str(ex):
            log.error("model %s: CUDA out of memory", self.model_name, exc_info=ex)
            return ModelFailed("Out of resources", OUT_OF_RESOURCES)
        log.warning("model %s: Invoking custom service failed.", self.model_name, exc_info=ex)
        return ModelFailed("Prediction failed", FAILED)

    def unload(self) -> None:
        if self._model_dir in sys.path:
            sys.path.remove(self._model_dir)
        if self._unpacked is not None:
            shutil.rmtree(self._unpacked, ignore_errors=True)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
