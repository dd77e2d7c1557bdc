"""Whether this host can run models on a GPU, asked lazily (torch is heavy).

Tests marked ``gpu`` skip with :func:`cuda_missing`'s reason where it is not
"", so ``make test`` stays green on a host without one.
"""

from __future__ import annotations

import functools
import importlib
import subprocess

CUDA = "CUDAExecutionProvider"


@functools.cache
def cuda_missing() -> str:
    """Return why torch cannot use a GPU here, "" when it can."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return "no CUDA device usable: torch is not installed"
    if not torch.cuda.is_available():
        return (
            f"no CUDA device usable: torch.cuda.is_available() is False (torch {torch.__version__})"
        )
    return ""


@functools.cache
def onnx_cuda_missing() -> str:
    """Return why ONNX Runtime cannot use a GPU here, "" when it can."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return "no CUDA for ONNX Runtime: onnxruntime is not installed"
    if CUDA not in ort.get_available_providers():
        return f"no CUDA for ONNX Runtime: onnxruntime {ort.__version__} has no {CUDA}"
    return ""


@functools.cache
def cudashm_missing() -> str:
    """Return why tritonclient's CUDA shared-memory helpers cannot run here, "" when they can."""
    try:
        importlib.import_module("tritonclient.utils.cuda_shared_memory")
    except Exception as ex:  # it raises its own error when cuda-python is missing
        return f"tritonclient's CUDA shared-memory helpers do not import here: {ex}"
    return ""


@functools.cache
def cuda_driver_missing() -> str:
    """Return why the CUDA driver cannot reach a GPU here, "" when it can."""
    from appliance.core import cuda

    try:
        count = cuda.driver().device_count()
    except cuda.CudaError as ex:
        return str(ex)
    return "" if count else "the CUDA driver sees no GPU"


def gpu_processes() -> dict[int, int] | None:
    """Return MiB of GPU memory by pid of every process with a CUDA context, per nvidia-smi.

    None where nvidia-smi is missing or fails.
    """
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    held: dict[int, int] = {}
    for line in done.stdout.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit():
            held[int(pid)] = held.get(int(pid), 0) + int(used.strip() or 0)
    return held
