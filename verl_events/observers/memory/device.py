"""Device memory (CUDA, Ascend NPU) around a stage, from torch's device module.

Per stage: the caching allocator's allocated and reserved bytes at begin and
end and their peaks over the stage (``reset_peak_memory_stats`` when it
begins), and the device's used and total bytes (``mem_get_info``: every
process on the device, NCCL and an inference engine's pools included).

Resetting the allocator's peaks changes what verl reports: its
``perf/max_memory_allocated_gb`` and ``perf/max_memory_reserved_gb``
(read at the end of verl's ``train_batch`` / ``infer_batch``, a peak over
the process's life in verl 0.9.1, which never resets it) become the peak
since the innermost stage the observer selected began.

:func:`device_module` finds the module (``torch.cuda``, else ``torch.npu``
once ``torch_npu`` is imported); nothing here runs without a device.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["DeviceGauge", "device_module"]


def device_module() -> tuple[str, Any] | None:
    """("cuda" or "npu", its torch module) when that device is present, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None  # a process without torch has no device memory of torch's
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda", cuda
    npu = getattr(torch, "npu", None)  # set by import torch_npu
    if npu is not None and npu.is_available():
        return "npu", npu
    return None


class DeviceGauge:
    """(allocated, reserved) now and their peaks, and the device's used and total bytes."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def read(self) -> tuple[Sequence[int], Sequence[int]] | None:
        m = self.module
        return (
            (int(m.memory_allocated()), int(m.memory_reserved())),
            (int(m.max_memory_allocated()), int(m.max_memory_reserved())),
        )

    def reset(self) -> bool:
        self.module.reset_peak_memory_stats()
        return True

    def device_used(self) -> tuple[int, int]:
        """(used, total) bytes on the device, every process's."""
        free, total = self.module.mem_get_info()
        return int(total) - int(free), int(total)
