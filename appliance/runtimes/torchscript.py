"""Serve a TorchScript ``model.pt`` with torch on the CPU or a GPU (the ``[torch]`` extra).

A TorchScript file does not reliably carry its tensors' names, dtypes or
shapes, so the model's ``config.toml`` declares them::

    [[inputs]]
    name = "pixels"
    dtype = "FP32"
    shape = [-1, 64]      # the whole shape; a free first dim on every tensor = batched

    [[outputs]]
    name = "probabilities"
    dtype = "FP32"
    shape = [-1, 10]

Inputs go to ``forward`` positionally, in the declared order. ``forward``
returns one tensor, a tuple or list of them (in the declared order of the
outputs), or a dict by output name.

A sequence model's control and state inputs (config.pbtxt's control_input
and state, see interface.py) come after the declared inputs: controls in
their order, then states; unless every input is named as one of
``forward``'s arguments (they go in its order) or every name ends in
``__<index>`` (Triton's PyTorch convention: in index order). Its state
outputs come after the declared outputs, in the states' order (or by
``__<index>``), or in its dict. When every declared dimension but the
batch is fixed, the model is run once at load on zeros, so a config that
does not fit the module fails at load with the reason, not at the first
request.

Threads: ``threads`` intra-op threads (1 by default) and one inter-op
thread per process, as one process serves one instance. Every call runs
under ``torch.inference_mode()``.

Device. With ``device = "cuda"`` (or ``"cuda:N"``) the module is moved to
that GPU; each input is copied there once from the request ring, and each
output back once into a numpy array, which the worker writes into its
response ring. Without a usable GPU the model fails to load and says so.
An input a client sent in CUDA shared memory on that GPU comes as a view of
the client's memory (``device_inputs``): torch reads it in place, and the
outputs of such a call stay on the GPU for the worker to write into the
client's output region (appliance/worker/cuda_regions.py).

Copies (on the CPU). Outputs are returned as numpy views of torch's tensors (the worker
then writes them once into its response ring). Request inputs are read-only
views of shared memory, mapped read-only in the worker. When the module's
graph holds no op that writes into a tensor (no schema with a ``(a!)``
alias, i.e. no in-place or ``out=`` op, and no op of unknown effect), they
are wrapped without a copy by ``torch.from_numpy``; otherwise each input is
copied once first, since a write into the read-only mapping would kill the
worker.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from appliance.config import device as devices
from appliance.core.device_tensors import on_device
from appliance.core.dtypes import DType, to_numpy
from appliance.core.tensor import TensorSpec
from appliance.model import Arrays, Outputs
from appliance.runtimes.interface import (
    ModelFileError,
    RuntimeModel,
    batchable,
    declared,
    import_runtime,
    specs_from_config,
)

# torch has no string tensors; every other dtype of the table maps.
_NO_TORCH = (DType.BYTES,)
# Namespaces of ops whose schema is known; nodes of others may write anywhere.
_KNOWN_NAMESPACES = ("aten", "prim")


class TorchScriptModel(RuntimeModel):
    """A TorchScript module run by torch on the CPU or a GPU."""

    platform = "pytorch_libtorch"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._torch: Any = None
        self._module: Any = None
        self.zero_copy = False

    def load(self) -> None:
        """Load the module, declare its tensors from config.toml, try it once.

        Raises:
            ModelFileError: torch is missing, the file is not TorchScript,
                config.toml does not declare the tensors, or the trial fails.
        """
        torch = import_runtime("torch")
        if devices.is_cuda(self.device):
            devices.require_torch_cuda(self.device)
        _set_threads(torch, self.threads)
        where = self.config_name
        inputs, outputs = _declared_specs(self.options, where)
        try:
            with warnings.catch_warnings():
                # torch 2.13 deprecates TorchScript in favour of torch.export;
                # serving the files users have is this runtime's purpose.
                warnings.filterwarnings("ignore", "`torch.jit.load` is deprecated")
                module = torch.jit.load(str(self.path), map_location=self.device)
        except Exception as ex:
            raise ModelFileError(
                f"{self.file_name} is not a TorchScript module (torch.jit.save a "
                f"torch.jit.script or trace of one): {_first_sentence(ex)}"
            ) from None
        module = module.to(self.device)
        module.eval()
        implicit_in, implicit_out = self.implicit_specs(batchable(inputs, outputs))
        if implicit_in:
            named = {spec.name for spec in outputs}
            inputs = _forward_order(module, [*inputs, *implicit_in])
            outputs = _indexed([*outputs, *(s for s in implicit_out if s.name not in named)])
        _check_arity(module, len(inputs), where)
        self._torch, self._module = torch, module
        self.declare(inputs, outputs)
        self.zero_copy = not writes_in_place(module)
        self.device_inputs = devices.is_cuda(self.device)
        # SAFETY: from_numpy warns on read-only arrays; they are wrapped only
        # when the graph was found to write into no tensor (see the docstring).
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        if not self.description:
            self.description = f"TorchScript module {module.original_name}"
        self._trial_run(where)

    def predict(self, inputs: Arrays, parameters: Mapping[str, Any]) -> Outputs:
        """Run ``forward`` on the inputs in declared order; name its results.

        Raises:
            ValueError: ``forward`` returned what the declared outputs do not fit.
        """
        return self._run(inputs)

    def _run(self, inputs: Arrays) -> dict[str, Any]:
        values = [inputs[spec.name] for spec in self.model_inputs]
        on_gpu = any(map(on_device, values))
        args = [self._tensor(value) for value in values]
        with self._torch.inference_mode():
            result = self._module(*args)
        outputs = self._outputs(result, on_gpu)
        if on_gpu:
            # The worker copies the outputs with the driver, outside torch's streams.
            self._torch.cuda.current_stream(self.device).synchronize()
        return outputs

    def _tensor(self, array: Any) -> Any:
        if on_device(array):
            # A view of the client's GPU memory, no copy (a clone when the
            # graph may write into its inputs: the buffer is the client's).
            tensor = self._torch.as_tensor(array, device=self.device)
            return tensor if self.zero_copy else tensor.clone()
        if devices.is_cuda(self.device):
            # The one copy: from the request ring straight to the GPU.
            return self._torch.from_numpy(array).to(self.device, non_blocking=False)
        if not (self.zero_copy or array.flags.writeable):
            array = array.copy()
        return self._torch.from_numpy(array)

    def _outputs(self, result: Any, on_gpu: bool = False) -> dict[str, Any]:
        names = [spec.name for spec in self.model_outputs]
        if isinstance(result, Mapping):
            missing = [name for name in names if name not in result]
            if missing:
                raise ValueError(
                    f"forward returned a dict without {', '.join(missing)} "
                    f"(it has {', '.join(map(str, result))})"
                )
            values = [result[name] for name in names]
        else:
            values = list(result) if isinstance(result, tuple | list) else [result]
            if len(values) != len(names):
                raise ValueError(
                    f"forward returned {len(values)} tensor(s); config.toml declares "
                    f"{len(names)} output(s): {', '.join(names)}"
                )
        convert = _on_gpu if on_gpu else _array
        return {name: convert(name, value) for name, value in zip(names, values, strict=True)}

    def _trial_run(self, where: str) -> None:
        """Run once on zeros when the declared shapes fix every size but the batch."""
        batched = self.max_batch_size > 0
        shapes = []
        for spec in self.model_inputs:
            shape = (1, *spec.shape[1:]) if batched else spec.shape
            if any(dim < 0 for dim in shape):
                return
            shapes.append((spec, shape))
        arrays = {spec.name: np.zeros(shape, to_numpy(spec.dtype)) for spec, shape in shapes}
        for array in arrays.values():
            array.flags.writeable = False  # as requests arrive
        try:
            produced = self._run(arrays)
        except Exception as ex:
            raise ModelFileError(
                f"{self.file_name}: a trial run on zeros of the shapes in {where} failed: "
                f"{type(ex).__name__}: {ex}"
            ) from None
        for spec in self.model_outputs:
            got = produced[spec.name]
            if not spec.matches_shape(got.shape) or (batched and got.shape[0] != 1):
                raise ModelFileError(
                    f"{where}: output {spec.name} is declared {list(spec.shape)}, but a trial "
                    f"run on one row gave shape {list(got.shape)}"
                )


def _declared_specs(
    options: Mapping[str, Any], where: str
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    tables = {what: declared(options, what, where) for what in ("inputs", "outputs")}
    missing = [what for what, found in tables.items() if not found]
    if missing:
        raise ModelFileError(
            f"{where}: declare the model's {' and '.join(missing)} ([[inputs]] and "
            "[[outputs]] tables with name, dtype and shape): a TorchScript file does not "
            "carry them reliably"
        )
    inputs = specs_from_config(tables["inputs"] or [], "inputs", where)
    outputs = specs_from_config(tables["outputs"] or [], "outputs", where)
    for spec in (*inputs, *outputs):
        if spec.dtype in _NO_TORCH:
            raise ModelFileError(f"{where}: {spec.name} is {spec.dtype.value}; torch has none")
    return inputs, outputs


def _forward_order(module: Any, specs: list[TensorSpec]) -> list[TensorSpec]:
    """The inputs in the order ``forward`` takes them (see the module's docstring)."""
    arguments = [arg.name for arg in list(module.forward.schema.arguments)[1:]]
    by_name = {spec.name: spec for spec in specs}
    if arguments[: len(specs)] and set(arguments[: len(specs)]) == set(by_name):
        return [by_name[name] for name in arguments[: len(specs)]]
    return _indexed(specs)


def _indexed(specs: list[TensorSpec]) -> list[TensorSpec]:
    """``specs`` in the order of their ``__<index>`` suffixes, when every name has one."""
    indexes = [spec.name.rpartition("__")[2] for spec in specs]
    if not all(index.isdigit() for index in indexes) or len(set(indexes)) < len(indexes):
        return specs
    return [spec for _, spec in sorted(zip(map(int, indexes), specs, strict=True))]


def writes_in_place(module: Any) -> bool:
    """Return True when the module's graph may write into a tensor."""
    for node in _nodes(module.inlined_graph):
        namespace = node.kind().partition("::")[0]
        schema = node.schema()
        if "!" in schema or (namespace not in _KNOWN_NAMESPACES and schema == "(no schema)"):
            return True
    return False


def _nodes(block: Any) -> Iterator[Any]:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def _set_threads(torch: Any, threads: int) -> None:
    # The inter-op pool can be sized only before its first use; a second
    # load in one process (tests) finds it started, which is fine.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    torch.set_num_threads(threads)


def _check_arity(module: Any, count: int, where: str) -> None:
    arguments = list(module.forward.schema.arguments)[1:]  # [0] is self
    required = [arg.name for arg in arguments if not arg.has_default_value()]
    if not len(required) <= count <= len(arguments):
        raise ModelFileError(
            f"{where}: declares {count} input(s), but forward takes "
            f"({', '.join(arg.name for arg in arguments)})"
        )


def _array(name: str, value: Any) -> npt.NDArray[Any]:
    if not hasattr(value, "numpy"):
        raise ValueError(f"forward returned {type(value).__name__} for output {name}, not a tensor")
    # .cpu() is the one copy back from a GPU, and no copy on the CPU.
    array: npt.NDArray[Any] = value.detach().cpu().numpy()
    return array


def _on_gpu(name: str, value: Any) -> Any:
    """An output left where torch made it: on the GPU, contiguous, for the worker to place."""
    if not getattr(value, "is_cuda", False):
        return _array(name, value)
    return value.detach().contiguous()


def _first_sentence(error: Exception) -> str:
    # torch's load errors go on for lines; a status note holds 256 bytes.
    text = str(error).strip().split("\n")[0].split(". ")[0]
    return f"{type(error).__name__}: {text}"
