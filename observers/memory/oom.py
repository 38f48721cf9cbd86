"""An out-of-memory error told from its type and message, and the bytes it asked for.

The allocators' own words (torch 2.13; messages as they reach a Ray caller too):

* CPU: ``RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator:
  can't allocate memory: you tried to allocate 4294967296 bytes. Error code 12 ...``;
* CUDA: ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 ...``;
* Ascend NPU: ``NPU out of memory. Tried to allocate 72.00 MiB (NPU 0; ...)``, raised as
  ``torch.OutOfMemoryError`` or ``RuntimeError`` depending on the release;
* Python's own ``MemoryError``, with no size.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["OutOfMemory", "out_of_memory"]

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_CPU = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes")
_DEVICE = re.compile(r"\b(CUDA|NPU) out of memory\. Tried to allocate (\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)")
_TYPES = re.compile(r"(?:^|\.)(OutOfMemoryError|MemoryError)\b")


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """Where memory ran out (``cpu``, ``cuda``, ``npu``, or None when the error does not say)
    and the bytes the failing allocation asked for (None when the message gives none)."""

    device: str | None
    asked_bytes: int | None


def out_of_memory(text: str) -> OutOfMemory | None:
    """The out-of-memory error in ``text`` (an exception's ``Type: message``), or None."""
    if found := _CPU.search(text):
        return OutOfMemory("cpu", int(found[1]))
    if found := _DEVICE.search(text):
        return OutOfMemory(found[1].lower(), round(float(found[2]) * _UNITS[found[3]]))
    head = text.split(":", 1)[0].strip()
    if _TYPES.search(head):
        return OutOfMemory(None, None)
    return None
