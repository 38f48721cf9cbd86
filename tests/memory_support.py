"""What the memory tests share: a real allocation, and a stand-in CUDA module.

No CUDA is here: the stand-in gives the device paths a caching allocator's counters.
tests/test_memory.py checks that it takes the calls the observer makes with the real
``torch.cuda`` functions' signatures.
"""

from __future__ import annotations

from typing import Any

import torch

MB = 1 << 20


def allocate(megabytes: int) -> None:
    held = torch.ones(megabytes * MB // 4)  # touched: resident
    del held


class StandInCuda:
    """A device module with a caching allocator's counters, for the device paths."""

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.resets = 0

    def is_available(self) -> bool:
        return True

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def memory_allocated(self, device: Any = None) -> int:
        return self.allocated

    def memory_reserved(self, device: Any = None) -> int:
        return self.reserved

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.peak_allocated

    def max_memory_reserved(self, device: Any = None) -> int:
        return self.peak_reserved

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.resets += 1
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return 80 * 2**30 - self.reserved - 2**30, 80 * 2**30  # another process holds 1 GiB
