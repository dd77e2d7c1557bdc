"""The names of a model repository's layout, and the error of one that breaks it.

The two config files a model directory may hold, the model files (and the
platforms naming them) a version directory may hold with the runtime each
picks, the ensemble's platform, and the key under which notes on unused
config.pbtxt fields travel. They are apart so that the scan
(repository.py), a model directory's settings (model_settings.py), its
version policy (model_versions.py) and a version's entry (version_entry.py)
share them without importing each other.
"""

from __future__ import annotations

from pathlib import Path

ONNX_CLASS = "appliance.runtimes.onnx:OnnxModel"
TORCHSCRIPT_CLASS = "appliance.runtimes.torchscript:TorchScriptModel"
PYTHON_CLASS = "appliance.runtimes.python_backend:PythonBackendModel"
CONFIG_FILE = "config.toml"
PBTXT_FILE = "config.pbtxt"

# Platform (Triton's names, and short ones) -> (model file name, runtime).
PLATFORMS: dict[str, tuple[str, str]] = {
    "onnxruntime_onnx": ("model.onnx", ONNX_CLASS),
    "onnx": ("model.onnx", ONNX_CLASS),
    "pytorch_libtorch": ("model.pt", TORCHSCRIPT_CLASS),
    "torchscript": ("model.pt", TORCHSCRIPT_CLASS),
    # Triton's Python backend: a model.py defining TritonPythonModel.
    "python": ("model.py", PYTHON_CLASS),
}
MODEL_FILES = {"model.onnx": ONNX_CLASS, "model.pt": TORCHSCRIPT_CLASS, "model.py": PYTHON_CLASS}
ENSEMBLE = "ensemble"
# Fields of a config.pbtxt the appliance does not use, logged by the runtime at load.
NOTES = "config_notes"


class RepositoryError(ValueError):
    """A repository or one of its models cannot be read; the message says why."""


def short_path(path: Path) -> str:
    """Name a path from its model directory on: a status note holds 256 bytes."""
    parts = path.parts
    depth = {CONFIG_FILE: 2, PBTXT_FILE: 2, **dict.fromkeys(MODEL_FILES, 3)}.get(path.name, 2)
    return "/".join(parts[-depth:])
