"""Where a model instance runs: ``cpu``, ``cuda`` (spread over GPUs) or ``cuda:N``.

The config names a device per model; the model worker resolves it for its
instance and checks it can be used before ``load()``. Nothing CUDA-related
is imported until a model asks for CUDA, so the CPU path stays as light as
it was (torch and onnxruntime are optional extras).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
DEVICE_HINT = 'expected "cpu", "cuda" or "cuda:N" (N a GPU index)'


class DeviceError(Exception):
    """The configured device cannot be used on this host; the message says why."""


def check(value: object) -> str:
    """Return what is wrong with a configured device, "" when nothing is."""
    if isinstance(value, str) and DEVICE.match(value):
        return ""
    return f"{DEVICE_HINT}, got {value!r}"


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def resolve(device: str, instance: int) -> str:
    """Return the device of one instance: ``cuda`` goes to GPU ``instance mod count``.

    Counting GPUs imports torch, so it happens here, in the model worker,
    and only for a CUDA model.
    """
    if device != "cuda":
        return device
    count = gpu_count()
    return f"cuda:{instance % count}" if count > 0 else "cuda:0"


def gpu_count() -> int:
    """Return torch's count of visible GPUs, 0 without torch or CUDA."""
    torch = _optional("torch")
    if torch is None:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:
        return 0


def require_torch_cuda(device: str) -> Any:
    """Return torch when it can run on ``device``.

    Raises:
        DeviceError: torch is missing, has no usable CUDA, or no such GPU.
    """
    torch = _optional("torch")
    if torch is None:
        raise DeviceError(f"device {device} requested but torch is not installed")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"device {device} requested but no GPU is usable "
            f"(torch.cuda.is_available() is False; torch {torch.__version__})"
        )
    index = int(device.partition(":")[2] or 0)
    count = int(torch.cuda.device_count())
    if index >= count:
        raise DeviceError(f"device {device} requested but torch sees {count} GPU(s)")
    return torch


def memory_allocated(device: str) -> int:
    """Return the bytes torch holds on ``device``; 0 on the CPU or without torch.

    Only reads torch when the worker already imported it for CUDA.
    """
    if not is_cuda(device):
        return 0
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        return int(torch.cuda.memory_allocated(device))
    except Exception:
        return 0


def _optional(package: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError:
        return None
