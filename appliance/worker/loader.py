"""Import, build and load one configured model, and describe what it declares.

Every failure is a :class:`LoadError` whose message names the config entry,
so ``appliance ctl status`` and the logs say which model broke and why.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from appliance.config import device as devices
from appliance.config.settings import ModelConfig
from appliance.core.metadata import ModelMetadata
from appliance.core.tensor import TensorSpec
from appliance.model import Model
from appliance.runtimes.interface import ModelFileError, RuntimeModel


class LoadError(Exception):
    """The model could not be imported, built or loaded."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """A loaded model and the interface it is served with."""

    model: Model
    metadata: ModelMetadata

    @property
    def max_batch_size(self) -> int:
        return self.metadata.max_batch_size


def load_model(
    config: ModelConfig,
    python_path: Sequence[str] = (),
    device: str | None = None,
    instance: int = 0,
) -> Loaded:
    """Import ``config.cls``, instantiate it with its options and load it.

    ``device`` is the instance's resolved device (see
    :func:`appliance.config.device.resolve`; the config's by default), set on the
    model before ``load()``. A runtime checks CUDA in
    its own way; for a Python model, torch must see the GPU.

    Raises:
        LoadError: import, construction, ``load()`` or declarations failed.
    """
    for entry in python_path:
        if entry not in sys.path:
            sys.path.insert(0, entry)
    cls = _import(config)
    where = f"model {config.name!r} ({config.cls})"
    try:
        model = cls(config.options)
        model.device = device or devices.resolve(config.device, 0)
        model.instance = instance
        if devices.is_cuda(model.device) and not isinstance(model, RuntimeModel):
            devices.require_torch_cuda(model.device)
        model.load()
    except devices.DeviceError as ex:
        raise LoadError(f"model {config.name!r}: {ex}") from ex
    except Exception as ex:
        raise LoadError(f"{where}: load failed: {type(ex).__name__}: {ex}") from ex
    # Read from the instance: a runtime model learns its interface in load().
    max_batch = model.max_batch_size if config.max_batch_size is None else config.max_batch_size
    inputs = _specs(where, "inputs", model.inputs)
    outputs = _specs(where, "outputs", model.outputs)
    if isinstance(model, RuntimeModel):
        try:
            model.check_implicit_shapes(max_batch > 0)
        except ModelFileError as ex:
            raise LoadError(f"{where}: load failed: {ex}") from None
    if max_batch > 0:
        for spec in (*(inputs or ()), *(outputs or ())):
            if not spec.shape or spec.shape[0] != -1:
                raise LoadError(
                    f"{where}: max_batch_size is {max_batch} but {spec.name} has no leading "
                    f"batch dimension (-1) in its shape {list(spec.shape)}"
                )
    metadata = ModelMetadata(
        name=config.name,
        versions=(model.version,),
        platform=model.platform,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch,
        supports=model.supported(),
        description=model.description or (cls.__doc__ or "").strip().split("\n")[0],
        listed=dict(model.listed_metadata),
    )
    return Loaded(model, metadata)


def _import(config: ModelConfig) -> type[Model]:
    module_name, _, class_name = config.cls.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as ex:
        raise LoadError(
            f"model {config.name!r}: cannot import module {module_name!r}: "
            f"{type(ex).__name__}: {ex}"
        ) from ex
    cls = getattr(module, class_name, None)
    if cls is None:
        raise LoadError(f"model {config.name!r}: module {module_name!r} has no {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise LoadError(
            f"model {config.name!r}: {config.cls} is not a subclass of appliance.model.Model"
        )
    return cls


def _specs(where: str, what: str, specs: object) -> tuple[TensorSpec, ...] | None:
    if specs is None:
        return None
    if not isinstance(specs, list | tuple) or not all(isinstance(s, TensorSpec) for s in specs):
        raise LoadError(f"{where}: {what} must be a list of spec(...) declarations or None")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise LoadError(f"{where}: {what} declares a name twice: {names}")
    return tuple(specs)
