"""A stage's result or inputs seen one way, whatever carried it.

verl hands a stage a ``DataProto`` (its legacy workers, the trainer), a
``TensorDict`` (verl 0.9's engine workers), and the CPU demo a ``Batch``
record with ``tensors`` and ``meta_info``; :func:`as_batch` gives each a
:class:`Batch`: its tensors by key, its metrics, its call flags.  Nothing is
imported here: only classes already imported can have made a value.

Thread safety: :data:`_KINDS` is a cache of a type's kind, filled once per
type; a racing fill writes the same answer.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["Batch", "as_batch", "unwrap"]


@dataclass(slots=True)
class Batch:
    """One result or input, seen the same way whatever carried it."""

    tensors: Any  # has .get(key, None): a dict, a TensorDict, or None
    found_metrics: Any  # Mapping[str, Any] | None; _UNREAD: a TensorDict's, read when first asked for
    kind: str  # "dataproto", "tensordict", "record" or "mapping"
    flags: Any = None  # a TensorDict whose non-tensor entries are the call's flags

    @property
    def metrics(self) -> Mapping[str, Any] | None:
        """The metrics it carries; a TensorDict's are read at the first call (the mismatch
        observer never asks for them)."""
        if self.found_metrics is _UNREAD:
            value = self.tensors
            metrics = unwrap(value.get("metrics", None)) if "metrics" in value.keys() else None
            self.found_metrics = _mapping(metrics)
        found: Mapping[str, Any] | None = self.found_metrics
        return found

    def tensor(self, key: str) -> torch.Tensor | None:
        """The tensor under ``key``, or None (also when torch was never imported: then
        nothing can be a tensor)."""
        torch = sys.modules.get("torch")
        if self.tensors is None or torch is None:
            return None
        found = self.tensors.get(key, None)
        return found if isinstance(found, torch.Tensor) else None

    def flag(self, key: str) -> Any:
        """The call's flag ``key`` (a TensorDict's non-tensor entry), or None."""
        if self.flags is None or key not in self.flags.keys():
            return None
        return unwrap(self.flags.get(key, None))


def as_batch(value: Any) -> Batch | None:
    """``value`` as a batch, or None for a bare value (a number, a tensor, anything else)."""
    kind = _KINDS.get(type(value))
    if kind is None:
        kind = _KINDS[type(value)] = _kind_of(value)
    if kind == "dataproto":
        info = value.meta_info
        return Batch(value.batch, _mapping(info.get("metrics")) if isinstance(info, Mapping) else None, kind)
    if kind == "tensordict":
        return Batch(value, _UNREAD, kind, flags=value)
    if kind == "mapping":
        return Batch(value, value, kind)
    tensors, info = getattr(value, "tensors", None), getattr(value, "meta_info", None)
    if isinstance(tensors, dict | Mapping) and isinstance(info, dict | Mapping):
        return Batch(tensors, _mapping(info.get("metrics")), "record")
    return None


_UNREAD = object()  # a TensorDict's metrics, not read yet

# A result's kind by its type, found once: isinstance against ABCs is slow.
_KINDS: dict[type, str] = {}


def _kind_of(value: Any) -> str:
    # Only classes already imported can have made ``value``: nothing is imported here.
    protocol = sys.modules.get("verl.protocol")
    if protocol is not None and isinstance(value, protocol.DataProto):
        return "dataproto"
    tensordict = sys.modules.get("tensordict")
    if tensordict is not None and isinstance(value, tensordict.TensorDictBase):
        return "tensordict"
    return "mapping" if isinstance(value, Mapping) else "other"


def unwrap(value: Any) -> Any:
    """A TensorDict's non-tensor entry as the value it holds, as ``verl.utils.tensordict_utils.get`` unwraps it."""
    tensordict = sys.modules.get("tensordict")
    if tensordict is not None:
        if isinstance(value, tensordict.NonTensorStack):
            return value.tolist()
        if isinstance(value, tensordict.NonTensorData):
            return value.data
    return value


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None
