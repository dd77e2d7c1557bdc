"""Where a model instance runs: ``cpu``, ``cuda`` (spread over GPUs) or ``cuda:N``.

The config names a device per model; the model worker resolves it for its
instance and checks it can be used before ``load()``. Nothing CUDA-related
is imported until a model asks for CUDA, so the CPU path stays as light as
it was (torch and onnxruntime are optional extras).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
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


def memory_in_use(device: str) -> int:
    """Return the GPU memory this process holds on ``device``; 0 on the CPU.

    NVML's count where nvidia-ml-py is installed: everything the process
    holds there (its CUDA context, torch's and ONNX Runtime's allocations).
    Without it, or where NVML cannot see this process, the bytes torch has
    allocated. Reads torch only when the worker already imported it.
    """
    if not is_cuda(device):
        return 0
    used = _nvml_used(device)
    if used is not None:
        return used
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        return int(torch.cuda.memory_allocated(device))
    except Exception:
        return 0


@functools.cache
def _nvml() -> Any:
    """Return pynvml, initialised, or None without nvidia-ml-py or a driver."""
    nvml = _optional("pynvml")
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except Exception:
        return None
    return nvml


def _nvml_used(device: str) -> int | None:
    nvml = _nvml()
    if nvml is None:
        return None
    index = int(device.partition(":")[2] or 0)
    torch = sys.modules.get("torch")
    try:
        if torch is not None:
            # CUDA's numbering can differ from NVML's (CUDA_VISIBLE_DEVICES,
            # CUDA_DEVICE_ORDER); the UUID names the same GPU in both.
            uuid = torch.cuda.get_device_properties(index).uuid
            handle = nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory is not None:
                return int(process.usedGpuMemory)
    except Exception:
        return None
    return None


def _optional(package: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError:
        return None
