"""``ts.torch_handler.base_handler``: TorchServe's BaseHandler, as handlers subclass it.

``initialize`` loads the archive's model as TorchServe does: an eager model
(``modelFile``'s one class, with the ``serializedFile`` state dict), a
TorchScript file (``.pt``), or an ONNX file (ONNX Runtime); the labels of
``index_to_name.json`` when the archive has one. ``handle`` runs
preprocess, inference and postprocess (or ``explain_handle`` when the
request came to /explanations). torch is imported when a model is loaded,
so a handler that subclasses this class without a torch model runs without
torch installed.
"""

from __future__ import annotations

import abc
import importlib
import logging
import os
import time
from typing import Any

from ..handler_utils.timer import timed
from ..utils.util import list_classes_from_module, load_label_mapping

logger = logging.getLogger(__name__)


def _torch() -> Any:
    return importlib.import_module("torch")


class BaseHandler(abc.ABC):  # noqa: B024 (TorchServe's own declares no abstract method)
    """Loads a TorchScript or eager (state dict) model and answers requests with it."""

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: Any = None
        self.initialized = False
        self.context: Any = None
        self.model_pt_path: str | None = None
        self.manifest: dict[str, Any] | None = None
        self.map_location: str | None = None
        self.explain = False
        self.target = 0
        self.profiler_args: dict[str, Any] = {}
        self.model_yaml_config: dict[str, Any] = {}

    def initialize(self, context: Any) -> None:
        """Load the model the manifest names (see the module's text).

        Raises:
            RuntimeError: the archive holds no model this class can load.
        """
        if context is not None and hasattr(context, "model_yaml_config"):
            self.model_yaml_config = context.model_yaml_config
        properties = context.system_properties
        torch = _torch()
        gpu = properties.get("gpu_id")
        if torch.cuda.is_available() and gpu is not None:
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{gpu}")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")
        self.manifest = context.manifest
        model_dir = properties.get("model_dir")
        model = (self.manifest or {}).get("model", {})
        self.model_pt_path = None
        if "serializedFile" in model:
            self.model_pt_path = os.path.join(model_dir, model["serializedFile"])
        model_file = model.get("modelFile", "")
        if model_file:
            logger.debug("Loading eager model")
            self.model = self._load_pickled_model(model_dir, model_file, self.model_pt_path)
            self.model.to(self.device)
            self.model.eval()
        elif self.model_pt_path and self.model_pt_path.endswith(".pt"):
            self.model = self._load_torchscript_model(self.model_pt_path)
            self.model.eval()
        elif self.model_pt_path and self.model_pt_path.endswith(".onnx"):
            self.model = self._load_onnx_model(self.model_pt_path)
        else:
            raise RuntimeError("No model weights could be loaded")
        self.mapping = load_label_mapping(os.path.join(model_dir, "index_to_name.json"))
        self.initialized = True

    def _load_torchscript_model(self, model_pt_path: str) -> Any:
        return _torch().jit.load(model_pt_path, map_location=self.device)

    def _load_onnx_model(self, model_path: str) -> Any:
        try:
            ort = importlib.import_module("onnxruntime")
        except ImportError:
            raise RuntimeError(
                f"{os.path.basename(model_path)}: ONNX Runtime is not installed "
                "(pip install 'appliance[onnx]')"
            ) from None
        providers = ["CPUExecutionProvider"]
        if self.map_location == "cuda":
            providers.insert(0, "CUDAExecutionProvider")
        return ort.InferenceSession(model_path, providers=providers)

    def _load_pickled_model(
        self, model_dir: str, model_file: str, model_pt_path: str | None
    ) -> Any:
        model_def_path = os.path.join(model_dir, model_file)
        if not os.path.isfile(model_def_path):
            raise RuntimeError("Missing the model.py file")
        module = importlib.import_module(model_file.split(".")[0])
        classes = list_classes_from_module(module)
        if len(classes) != 1:
            raise ValueError(f"Expected only one class as model definition. {classes}")
        model = classes[0]()
        if model_pt_path:
            state_dict = _torch().load(model_pt_path, map_location=self.device)
            model.load_state_dict(state_dict)
        return model

    @timed
    def preprocess(self, data: Any) -> Any:
        """The requests' data as a tensor on the model's device."""
        return _torch().as_tensor(data, device=self.device)

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """The model's output for ``data``, without gradients."""
        torch = _torch()
        with torch.inference_mode():
            return self.model(data.to(self.device), *args, **kwargs)

    @timed
    def postprocess(self, data: Any) -> Any:
        """The output as a list, one item per request."""
        return data.tolist()

    def handle(self, data: Any, context: Any) -> Any:
        """Answer a batch: preprocess, inference, postprocess (or explain)."""
        start_time = time.time()
        self.context = context
        if self._is_describe():
            output = [self.describe_handle()]
        else:
            data_preprocess = self.preprocess(data)
            if not self._is_explain():
                output = self.postprocess(self.inference(data_preprocess))
            else:
                output = self.explain_handle(data_preprocess, data)
        context.metrics.add_time(
            "HandlerTime", round((time.time() - start_time) * 1000, 2), None, "ms"
        )
        return output

    def explain_handle(self, data_preprocess: Any, raw_data: Any) -> Any:
        """The explanation of the first request (its ``data`` or ``body``, and ``target``)."""
        inputs = None
        target = 0
        row = raw_data[0]
        if isinstance(row, dict):
            inputs = row.get("data") or row.get("body")
            target = row.get("target") or 0
        return self.get_insights(data_preprocess, inputs, target)

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any) -> Any:
        """What explain_handle answers; a handler that explains overrides it."""
        raise NotImplementedError(f"{type(self).__name__} does not explain its predictions")

    def _is_explain(self) -> bool:
        if self.context and self.context.get_request_header(0, "explain") == "True":
            self.explain = True
            return True
        return False

    def _is_describe(self) -> bool:
        return bool(self.context and self.context.get_request_header(0, "describe") == "True")

    def describe_handle(self) -> Any:
        """What a describe request answers; None unless a handler overrides it."""
        return None

    def get_device(self) -> Any:
        return self.device
