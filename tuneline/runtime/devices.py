"""The machine's accelerators, counted without importing torch, so that a config can be checked against the machine
before anything starts, and the launch chooses its processes.
"""

from __future__ import annotations

import os


def gpu_count() -> int:
    """Visible CUDA devices, counted without importing torch into the flow's process.

    Without NVIDIA's management library there is no NVIDIA driver, so no CUDA device, unless this is a ROCm machine
    (/dev/kfd), where torch is asked."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        counted = _nvml_device_count()
    except OSError:  # no NVML library: no NVIDIA driver
        counted = None if os.path.exists("/dev/kfd") else 0
    if counted is not None:
        return counted
    import torch

    return torch.cuda.device_count()


def _nvml_device_count() -> int | None:
    """Devices NVML sees; OSError without its library, None when it will not answer (then torch decides)."""
    import ctypes

    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
    finally:
        nvml.nvmlShutdown()
