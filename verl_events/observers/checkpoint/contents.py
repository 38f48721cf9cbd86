"""What a checkpoint object holds, tensor by tensor: the state dicts verl hands to
``torch.save``, gets back from ``torch.load``, and holds after ``load_state_dict``.

:func:`describe` walks an object (dicts by key, lists and tuples by index, at most
:data:`MAX_DEPTH` deep) and gives each tensor an entry named by its path
(``model.layers.0.mlp.up_proj.weight``, ``state.3.exp_avg``): shape, dtype, bytes, the
weight-sync observer's fingerprint and its count of NaN and infinite values, all computed
where the tensor lives.  A distributed tensor is its own shard (a ``DTensor``'s local
tensor, a ``ShardedTensor``'s local shards): what this rank saves.  A NumPy array (NumPy's
RNG state) is read as a tensor.  Everything else that is a number, a text, a bool or None
(the optimizer's settings, the scheduler's counters, Python's RNG state) goes into one
entry, :data:`VALUES`, whose fingerprint is that of the values and their names: two
states with the same tensors and other settings differ there.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..weight_sync.fingerprint import dtype_name, fingerprint, nonfinite_count
from .record import VALUES, TensorEntry

__all__ = ["MAX_DEPTH", "VALUES", "describe"]

#: How deep a state is walked: a state dict is two or three levels; deeper is no state dict.
MAX_DEPTH = 16


def describe(state: Any) -> dict[str, TensorEntry]:
    """Every tensor of ``state`` by name, and :data:`VALUES` (see the module docstring)."""
    entries: dict[str, TensorEntry] = {}
    values: list[list[str]] = []
    _walk(state, "", entries, values, 0)
    if values:
        digest = hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]
        entries[VALUES] = ((len(values),), "values", 0, digest, 0)
    return entries


def _walk(item: Any, name: str, entries: dict[str, TensorEntry], values: list[list[str]], depth: int) -> None:
    shards = _local_shards(item)  # first: a ShardedTensor (FSDP1's sharded state) is a Tensor too
    if shards is not None:
        for i, shard in enumerate(shards):
            entries[f"{name}#shard{i}"] = _entry(shard)
        return
    tensor = _as_tensor(item)
    if tensor is not None:
        entries[name or "(tensor)"] = _entry(tensor)
        return
    if depth >= MAX_DEPTH:
        values.append([name, f"<{type(item).__name__} deeper than {MAX_DEPTH}>"])
    elif isinstance(item, dict):
        for key, value in item.items():
            _walk(value, f"{name}.{key}" if name else str(key), entries, values, depth + 1)
    elif isinstance(item, (list, tuple)):
        for index, value in enumerate(item):
            _walk(value, f"{name}.{index}" if name else str(index), entries, values, depth + 1)
    elif item is None or isinstance(item, (bool, int, float, str)):
        values.append([name, repr(item)])
    else:  # an object we do not walk: its type is all that is compared
        values.append([name, f"<{type(item).__name__}>"])


def _as_tensor(item: Any) -> Any:
    """``item`` as a plain tensor (a DTensor's local one), a NumPy array as one; else None."""
    import torch

    if isinstance(item, torch.Tensor):
        to_local = getattr(item, "to_local", None)  # a DTensor: this rank's shard
        return to_local() if callable(to_local) else item
    if type(item).__module__ == "numpy" and type(item).__name__ == "ndarray" and item.dtype.kind in "biuf":
        import numpy

        return torch.from_numpy(numpy.ascontiguousarray(item))
    return None


def _local_shards(item: Any) -> list[Any] | None:
    """A ShardedTensor's local shards' tensors, else None."""
    local_shards = getattr(item, "local_shards", None)
    if not callable(local_shards):
        return None
    return [shard.tensor for shard in local_shards()]


def _entry(tensor: Any) -> TensorEntry:
    return (
        tuple(int(n) for n in tensor.shape),
        dtype_name(tensor.dtype) or str(tensor.dtype),
        tensor.numel() * tensor.element_size(),
        fingerprint(tensor),
        nonfinite_count(tensor),
    )
