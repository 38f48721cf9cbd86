"""Which weights a step's two sides of the mismatch were computed with.

In verl's asynchronous v1 modes (``colocate_async``, ``separate_async``) a batch's responses
can have been sampled with weights older than the ones the trainer recomputes their log-probs
with: then ``|Δ log p|`` holds the policy's own change between the two versions, not only the
engines' numerical disagreement.  verl tags every response with the versions of the weights
that sampled it: ``min_global_steps`` and ``max_global_steps``, the ``global_steps`` of the
weight syncs in force when its generation began and ended (``extra_fields`` of each row in
v1's TensorDict; ``non_tensor_batch`` columns in a legacy ``DataProto``).  By verl's own
reckoning (its ``training/off_policy/trajectory_staleness`` metric) the trainer's weights at
step N are version N - 1, so a response is ``(N - 1) - max_global_steps`` versions behind.

:func:`weight_versions` reads the tags; a batch without them (the legacy trainer, the CPU
demo, verl's ``sync`` mode before 0.9) gives None.  Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..batch import as_batch

__all__ = ["weight_versions"]


def weight_versions(inputs: Any, step: int | None) -> dict[str, int] | None:
    """``{"trainer", "rollout_min", "rollout_max"}``: the trainer's weight version at ``step``
    (verl's ``step - 1``) and the oldest and newest versions that sampled the batch's responses;
    None where the batch carries no version tags or the step is unknown."""
    if step is None or inputs is None:
        return None
    found = _tagged(inputs)
    if found is None:
        return None
    oldest, newest = found
    return {"trainer": step - 1, "rollout_min": oldest, "rollout_max": newest}


def _tagged(inputs: Any) -> tuple[int, int] | None:
    """The smallest ``min_global_steps`` and the largest ``max_global_steps`` of the batch's rows."""
    batch = as_batch(inputs)
    if batch is None:
        return None
    if batch.kind == "tensordict":
        rows = batch.flag("extra_fields")
        if not isinstance(rows, Sequence) or not all(isinstance(row, Mapping) for row in rows):
            return None
        starts = [row.get("min_global_steps") for row in rows]
        ends = [row.get("max_global_steps") for row in rows]
    elif batch.kind == "dataproto":
        columns = getattr(inputs, "non_tensor_batch", None) or {}
        if "min_global_steps" not in columns or "max_global_steps" not in columns:
            return None
        starts, ends = list(columns["min_global_steps"]), list(columns["max_global_steps"])
    else:
        return None
    oldest, newest = _whole(starts), _whole(ends)
    if not oldest or not newest:
        return None
    return min(oldest), max(newest)


def _whole(values: list[Any]) -> list[int] | None:
    """The values as ints, or None when one is missing or not a whole number (numpy's too)."""
    whole = []
    for value in values:
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            return None
        if isinstance(value, bool) or number != value:
            return None
        whole.append(number)
    return whole
