"""How much memory this machine has: `Machine.probe`'s ``device_memory`` and
``host_memory``, read without starting any device runtime.

CUDA devices are asked through NVML (the library behind ``nvidia-smi``), as torch
counts them, so no CUDA context is created and ``fork`` stays usable. The host's memory
is the smaller of its physical memory and the limit of the control group it runs in (a
container's or a SLURM job's allocation).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

#: where a cgroup's memory limit is read: v2, then v1
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),
                  Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
#: a cgroup v1 "limit" at or above this is no limit (the kernel writes a huge number)
_NO_LIMIT = 1 << 60


@functools.lru_cache(maxsize=1)
def host_memory() -> int | None:
    """Bytes of memory this process may use: physical memory, or the cgroup's limit when
    that is lower; None where neither can be read."""
    physical: int | None = None
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and size > 0:
            physical = pages * size
    except (AttributeError, OSError, ValueError):
        pass
    limit = _cgroup_limit()
    if physical is None:
        return limit
    return physical if limit is None else min(physical, limit)


def _cgroup_limit() -> int | None:
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _NO_LIMIT:
            return int(text)
    return None


@functools.lru_cache(maxsize=1)
def cuda_device_memory() -> int | None:
    """Bytes of memory of the smallest NVIDIA GPU NVML lists, or None where NVML is
    absent or fails (no driver, another vendor's GPU)."""
    import ctypes  # here: only a machine with CUDA devices asks, once per process

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
            return None
        sizes = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            memory = _Memory()
            if (nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0
                    or nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0):
                return None
            sizes.append(int(memory.total))
        return min(sizes) or None
    finally:
        nvml.nvmlShutdown()


__all__ = ["cuda_device_memory", "host_memory"]
