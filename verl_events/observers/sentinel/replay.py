"""The sentinel's side of a replay: did the anomaly show again, and the batch that did it.

When a stage raised anomalies on this rank and the stage is replayed (see
:mod:`verl_events.capture.replay`), the sentinel reads the replay's metrics and
judges each metric that raised one by the rule it broke:

* ``non_finite``: the replay's value is NaN/inf again (a ``*/nonfinite_count``
  above 0 again);
* ``above`` / ``below``: it breaks the same threshold;
* ``spike``: it is again as large a move from the median the anomaly was
  judged by (the rule's ``ratio``, in its direction).

Any metric again: **reproducible** (the inputs or the weights carry it).
None: **transient** (the same inputs and weights did not reproduce it:
suspect a nondeterministic kernel or the device).  A replay neither joins
a metric's history nor raises anomalies of its own.

The stage's tensor inputs go to ``inputs_rank{R}.pt`` in the replay's
directory (``torch.save`` of a dict of CPU tensors: a DataProto's batch, a
``tensors`` dict, a dict's tensors, or the tensor itself), so the batch can be looked at: which
rows carried the NaN.  Replays are bounded by the armed observers'
``max_captures``, so these files are too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_events import AnomalyEvent, StageEnd, prepare_output_dir, stage_output_dir

from .record import inputs_file_name
from .rules import MetricRule
from .spike import moved_as_far

__all__ = ["describe", "judge", "keep_inputs"]

logger = logging.getLogger("verl_events.sentinel")

_COUNT_SUFFIX = "/nonfinite_count"


def judge(
    raised: list[AnomalyEvent], metrics: Mapping[str, float], rules: Mapping[str, MetricRule]
) -> tuple[str, dict[str, float]]:
    """The verdict on a replay, and the values of the metrics that broke their rule again."""
    again = {}
    for found in raised:
        value = metrics.get(found.metric)
        if value is not None and _breaks_again(found, value, rules.get(found.metric)):
            again[found.metric] = value
    return ("reproducible" if again else "transient"), again


def describe(verdict: str, again: Mapping[str, float]) -> str:
    """The verdict as the log says it."""
    if verdict == "reproducible":
        shown = ", ".join(f"{metric} {value:g}" for metric, value in again.items())
        return f"reproducible: {shown} again with the same inputs and weights"
    return (
        "transient: not reproduced with the same inputs and weights (suspect a nondeterministic kernel or the device)"
    )


def _breaks_again(found: AnomalyEvent, value: float, rule: MetricRule | None) -> bool:
    if found.rule == "non_finite":
        return not math.isfinite(value) or (found.metric.endswith(_COUNT_SUFFIX) and value > 0)
    if found.rule == "above" and found.baseline is not None:
        return value > found.baseline
    if found.rule == "below" and found.baseline is not None:
        return value < found.baseline
    if found.rule == "spike" and rule is not None and rule.spike is not None and found.baseline is not None:
        return math.isfinite(value) and moved_as_far(rule.spike, value, found.baseline)
    return False


def keep_inputs(root: Path, event: StageEnd) -> str | None:
    """Save the replay's tensor inputs beside its outputs; the path relative
    to ``root``, or None when the inputs hold no tensor."""
    import torch

    tensors = _tensors(event.inputs, torch)
    if not tensors:
        return None
    directory = prepare_output_dir(stage_output_dir(root, event))
    path = directory / inputs_file_name(event.rank)
    # clone: verl's TensorDicts arrive consolidated, their tensors views of one storage as several
    # dtypes, which torch.save refuses ("view the same data as different types").
    torch.save({name: tensor.detach().cpu().clone() for name, tensor in tensors.items()}, path)
    return str(path.relative_to(root))


def _tensors(inputs: Any, torch: Any) -> dict[str, Any]:
    """The named tensors of a stage's input: verl's DataProto (``batch``, a
    TensorDict), an object with a ``tensors`` dict, a mapping, or a tensor."""
    if isinstance(inputs, torch.Tensor):
        return {"input": inputs}
    held = inputs
    for attribute in ("batch", "tensors"):
        inner = getattr(inputs, attribute, None)
        if inner is not None and hasattr(inner, "items"):
            held = inner
            break
    if not hasattr(held, "items"):
        return {}
    return {str(name): value for name, value in held.items() if isinstance(value, torch.Tensor)}
