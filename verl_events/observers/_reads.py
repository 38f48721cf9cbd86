"""Numbers still on their device, brought to the host together by one copy.

Each ``float()``, ``int()`` or ``.item()`` of a tensor is a copy of its own, and on a
GPU a wait for the device; an observer that reads a few dozen numbers asks for them all
(:meth:`Reads.add`) and then reads them once (:meth:`Reads.fetch`).

Thread safety: none; one :class:`Reads` per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["Reads"]


class Reads:
    """Tensors to read, as float64; each one's numbers come after :meth:`fetch`."""

    __slots__ = ("_parts", "_values")

    def __init__(self) -> None:
        self._parts: list[torch.Tensor] = []
        self._values: list[list[float]] = []

    def add(self, tensor: torch.Tensor) -> Callable[[], list[float]]:
        """Ask for ``tensor``'s elements (all on one device, no autograd history); the
        function returned gives them, flattened and in order, once :meth:`fetch` ran."""
        import torch

        index = len(self._parts)
        flat = tensor if tensor.dim() == 1 else tensor.reshape(-1)
        self._parts.append(flat if flat.dtype == torch.float64 else flat.double())
        return lambda: self._values[index]

    def fetch(self) -> None:
        """Copy every number asked for to the host, in one copy."""
        import torch

        if not self._parts:
            return
        numbers = torch.cat(self._parts).tolist()
        at = 0
        for part in self._parts:
            self._values.append(numbers[at : at + part.numel()])
            at += part.numel()
