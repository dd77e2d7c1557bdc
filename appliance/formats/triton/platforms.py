"""config.pbtxt's ``platform`` or ``backend``, named as a model directory's settings name it.

onnxruntime_onnx (backend onnxruntime) and pytorch_libtorch (backend
pytorch) pick their runtime, backend python Triton's Python backend, and
``platform: "ensemble"`` an ensemble; any other is refused, naming those
served. Apart from the rest of the config (config_pbtxt.py) because what
the platform is decides which of its fields apply.
"""

from __future__ import annotations

from typing import Any

from appliance.formats.triton.sequences import PbtxtError

PYTHON = "python"
ENSEMBLE = "ensemble"

_PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime_onnx",
    "pytorch_libtorch": "pytorch_libtorch",
}
_BACKENDS = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch", PYTHON: PYTHON}


def platform_of(config: Any) -> str:
    """The platform a ModelConfig names, "" when it names none.

    Raises:
        PbtxtError: its platform or backend has no runtime here.
    """
    if config.platform == ENSEMBLE:
        return ENSEMBLE
    if config.platform:
        found = _PLATFORMS.get(config.platform)
        if found is None:
            raise PbtxtError(
                f"platform: {config.platform!r} has no runtime here; the appliance serves "
                f"{' and '.join(_PLATFORMS)} model files"
            )
        return found
    if config.backend:
        found = _BACKENDS.get(config.backend)
        if found is None:
            raise PbtxtError(
                f"backend: {config.backend!r} has no runtime here; the appliance serves "
                f"the {', '.join(_BACKENDS)} backends"
            )
        return found
    return ""
