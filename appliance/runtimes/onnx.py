"""Serve ``model.onnx`` with ONNX Runtime (the ``[onnx]`` extra).

The interface comes from the file: input and output names, dtypes (mapped
onto the appliance's dtype table below) and shapes, with symbolic or unknown
dimensions as -1. A model whose every input and output has a free first
dimension is batched (see ``interface.py``). ``config.toml`` may fix free
dimensions (``[[inputs]]``/``[[outputs]]`` with ``name`` and ``shape``), set
``max_batch_size`` and ``threads``.

With ``device = "cuda"`` (or ``"cuda:N"``) the session runs on that GPU
through the CUDA execution provider (``onnxruntime-gpu``, the ``[gpu]``
extra); without it, or when its CUDA libraries do not load, the model fails
to load and says so.

Session settings suit one process per instance: ``threads`` intra-op
threads (1 by default), one inter-op thread, sequential execution, and no
spinning thread pool, so an idle instance takes no CPU from its neighbours.
Request arrays go to ``run()`` as they are (ONNX Runtime reads contiguous
CPU arrays in place, read-only ones included); BYTES elements are decoded
to str, which is what ONNX Runtime's string tensors take.

On a GPU, inputs a client sent in CUDA shared memory are bound where they
are (IOBinding: no copy), and the outputs of such a call are left on the
GPU for the model worker to write into the client's output region.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.config import device as devices
from appliance.core.device_tensors import DeviceArray, on_device
from appliance.core.dtypes import DType, to_numpy
from appliance.core.tensor import TensorSpec
from appliance.model import Arrays, Outputs
from appliance.runtimes.interface import (
    ModelFileError,
    RuntimeModel,
    declared,
    import_runtime,
    merge_specs,
)

_CUDA = "CUDAExecutionProvider"
_ORT_CODE = re.compile(r"^\[ONNXRuntimeError\] : \d+ : (\w+) : ")
# ONNX Runtime's type strings -> the appliance's dtypes.
ONNX_DTYPES: dict[str, DType] = {
    "tensor(bool)": DType.BOOL,
    "tensor(uint8)": DType.UINT8,
    "tensor(uint16)": DType.UINT16,
    "tensor(uint32)": DType.UINT32,
    "tensor(uint64)": DType.UINT64,
    "tensor(int8)": DType.INT8,
    "tensor(int16)": DType.INT16,
    "tensor(int32)": DType.INT32,
    "tensor(int64)": DType.INT64,
    "tensor(float16)": DType.FP16,
    "tensor(float)": DType.FP32,
    "tensor(double)": DType.FP64,
    "tensor(string)": DType.BYTES,
}


class OnnxModel(RuntimeModel):
    """An ONNX model file run by ONNX Runtime on the CPU or with its CUDA provider."""

    platform = "onnxruntime_onnx"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._session: Any = None
        self._output_names: list[str] = []
        self._strings: set[str] = set()

    def load(self) -> None:
        """Open the session and read the interface from the model.

        Raises:
            ModelFileError: onnxruntime is missing, the file is not a valid
                ONNX model, or it uses a type the appliance cannot carry.
        """
        session = self._open(import_runtime("onnxruntime"))
        where = self.config_name
        inputs = merge_specs(
            self._specs(session.get_inputs(), "input"),
            declared(self.options, "inputs", where),
            "inputs",
            where,
        )
        outputs = merge_specs(
            self._specs(session.get_outputs(), "output"),
            declared(self.options, "outputs", where),
            "outputs",
            where,
        )
        self.declares_shapes = True
        self.declare(inputs, outputs)
        self._session = session
        self._output_names = [spec.name for spec in outputs]
        self._strings = {spec.name for spec in inputs if spec.dtype is DType.BYTES}
        # String tensors never live on a GPU: such a model takes host inputs only.
        self.device_inputs = devices.is_cuda(self.device) and not any(
            spec.dtype is DType.BYTES for spec in (*inputs, *outputs)
        )
        self._gpu = int(self.device.partition(":")[2] or 0) if self.device_inputs else 0
        if not self.description:
            meta = session.get_modelmeta()
            producer = f" from {meta.producer_name}" if meta.producer_name else ""
            self.description = meta.description or f"ONNX model {meta.graph_name}{producer}"

    def _open(self, ort: Any) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # An idle spinning pool would burn a core beside the other instances.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        providers = self._providers(ort)
        try:
            session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=providers
            )
        except Exception as ex:
            raise ModelFileError(
                f"ONNX Runtime cannot load {self.file_name}: {_ort_reason(str(ex), self.path)}"
            ) from None
        if devices.is_cuda(self.device) and _CUDA not in session.get_providers():
            # ONNX Runtime falls back to the CPU when the CUDA libraries do not load.
            raise devices.DeviceError(
                f"device {self.device} requested but ONNX Runtime could not start its "
                f"{_CUDA} (the CUDA and cuDNN libraries it needs did not load; see the log)"
            )
        return session

    def _providers(self, ort: Any) -> list[Any]:
        if not devices.is_cuda(self.device):
            return ["CPUExecutionProvider"]
        if _CUDA not in ort.get_available_providers():
            raise devices.DeviceError(
                f"device {self.device} requested but onnxruntime {ort.__version__} has no "
                f"{_CUDA} (install onnxruntime-gpu: pip install 'appliance[gpu]')"
            )
        device_id = int(self.device.partition(":")[2] or 0)
        return [(_CUDA, {"device_id": device_id}), "CPUExecutionProvider"]

    def _specs(self, args: list[Any], what: str) -> list[TensorSpec]:
        specs = []
        for arg in args:
            dtype = ONNX_DTYPES.get(arg.type)
            if dtype is None:
                raise ModelFileError(
                    f"{self.file_name}: {what} {arg.name} has type {arg.type}, which the appliance "
                    f"cannot carry (it carries {', '.join(ONNX_DTYPES)})"
                )
            shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape or ())
            specs.append(TensorSpec(arg.name, dtype, shape))
        return specs

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        """Run the session on the (checked) inputs; return every output.

        Raises:
            ValueError: a BYTES element is not UTF-8 text.
        """
        if self.device_inputs and any(map(on_device, inputs.values())):
            return self._run_bound(inputs)
        feeds = {
            name: _strings(name, array) if name in self._strings else array
            for name, array in inputs.items()
        }
        results = self._session.run(self._output_names, feeds)
        return dict(zip(self._output_names, results, strict=True))

    def _run_bound(self, inputs: Arrays) -> Outputs:
        """Run on inputs in GPU memory, in place (IOBinding); the outputs stay on the GPU."""
        binding = self._session.io_binding()
        for name, value in inputs.items():
            if on_device(value):
                interface = getattr(value, "__cuda_array_interface__")  # noqa: B009
                binding.bind_input(
                    name,
                    "cuda",
                    self._gpu,
                    np.dtype(interface["typestr"]).type,
                    list(interface["shape"]),
                    interface["data"][0],
                )
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self._output_names:
            binding.bind_output(name, "cuda", self._gpu)
        self._session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        outputs: dict[str, Any] = {}
        for name, value in zip(self._output_names, binding.get_outputs(), strict=True):
            dtype = to_numpy(ONNX_DTYPES[value.data_type()])
            outputs[name] = DeviceArray(
                value.data_ptr(), value.shape(), np.dtype(dtype), self._gpu, value
            )
        return outputs


def _strings(name: str, array: npt.NDArray[Any]) -> npt.NDArray[np.object_]:
    """Decode BYTES elements: ONNX Runtime's string tensors hold str."""
    try:
        text = [
            element.decode() if isinstance(element, bytes) else str(element)
            for element in array.flat
        ]
    except UnicodeDecodeError as ex:
        raise ValueError(f"input {name}: an element is not UTF-8 text ({ex})") from None
    return np.array(text, dtype=object).reshape(array.shape)


def _ort_reason(text: str, path: Path) -> str:
    """Shorten ONNX Runtime's load error to its code and reason."""
    text = text.replace(f"Load model from {path} failed:", "")
    return _ORT_CODE.sub(r"\1: ", text).strip()
