"""How far each row is from its tolerance, for ranking: scale-aware for every statistic.

The verdict (:func:`~.tolerance.judge`) measures ``|a - b|`` against
``atol * magnitude + rtol * |b|``.  For a statistic near zero, the min of
Adam's squared-gradient average (5.6e-18 vs 2.7e-20) or a loss that is the
mean of values centred on zero (0 vs 3.7e-8), ``rtol * |b|`` is next to
nothing, so that ratio (:func:`~.tolerance.over_tolerance`) runs to
thousands for rounding noise, far past a weight that moved 1 %.  The ranking
measures such a statistic against a tenth of the scale of the numbers it
belongs to instead, as triage's spike ranking does
(:mod:`verl_events.apps.triage.spike`):

    distance = |a - b| / (atol * M + rtol * max(|b|, floor))

with ``floor = NEAR_ZERO * S`` for max, min and mean and
``NEAR_ZERO * S * sqrt(n)`` for the norm (the norm of ``n`` elements of
``NEAR_ZERO * S`` each), ``n`` the tensor's element count, ``S`` its
**scale** (:func:`op_scales`).  A statistic at least that floor gets its
ratio over tolerance unchanged; the distance is never larger than it, so a
distance above 1 is always a divergence (but a divergence of a statistic
far below its scale can rank below 1).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from .table import STATS, Row, entry_parts
from .tolerance import Tolerance, magnitude, ratio, shared_stats

__all__ = ["NEAR_ZERO", "op_scales", "own_scale", "scaled_distance"]

NEAR_ZERO = 0.1  # a statistic below a tenth of its scale is measured against that tenth
_FORWARD = re.compile(r"\.forward(\.\d+)?$")


def own_scale(stats: Mapping[str, float | None], size: int | None) -> float:
    """A tensor's own scale on one side: its root mean square, norm over the
    square root of its element count (so a scalar and a large tensor
    compare), or its :func:`~.tolerance.magnitude` without a norm or a
    size; 0.0 when neither is known."""
    norm = stats.get("norm")
    if norm is not None and math.isfinite(norm) and size:
        return abs(norm) / math.sqrt(size)
    return magnitude(stats)


def _own(row: Row) -> float:
    return max(own_scale(row.a_stats, row.sizes[0]), own_scale(row.b_stats, row.sizes[1]))


def _floating(row: Row) -> bool:
    """Whether the row is a floating tensor on some side: it has a norm
    (msprobe has none for an integer tensor) and is not a Python number
    (dtype ``<class 'float'>``: an eps or a learning rate, not a value
    computed from)."""
    return any(
        stats.get("norm") is not None and not dtype.startswith("<class")
        for stats, dtype in ((row.a_stats, row.dtypes[0]), (row.b_stats, row.dtypes[1]))
    )


def _identity(row: Row, sign: float = 1.0) -> str:
    """What the table shows of a tensor (with ``sign`` -1: of its negation):
    one tensor, output of one op and input of the next, shows the same on
    both sides.  The norm counts without its sign (msprobe writes a 0-d
    tensor's value as its norm) and -0.0 as 0.0."""

    def side(stats: Mapping[str, float | None]) -> list[float | None]:
        top, bottom, mean, norm = (stats.get(s) for s in STATS)
        if sign < 0:  # the negation's max is minus the min
            top, bottom = bottom, top
        return [None if v is None else sign * v + 0.0 for v in (top, bottom, mean)] + [
            None if norm is None else abs(norm)
        ]

    return repr((row.dtypes, row.sizes, side(row.a_stats), side(row.b_stats)))


def op_scales(rows: list[Row]) -> None:
    """Set each row's :attr:`~.table.Row.scale`, ``S``, in table order (A's
    execution order).

    Forward entries (API calls and modules), op by op:

    * an **input** that is an earlier op's output (the same dtype, shape and
      statistics on both sides; or their negation, as msprobe does not hook
      unary minus) has the scale that output carried on, or its own
      (:func:`own_scale`) where that is larger; any other input (a
      parameter, the batch) has its own;
    * the **op's scale** is the largest scale among its floating tensors,
      inputs, parameters and outputs (not integer tensors, which are
      indices, nor Python numbers: an eps or a learning rate);
    * each **output** has the op's scale, and carries its own on to the ops
      that read it, unless it is below ``NEAR_ZERO`` of the op's: then it
      is a cancellation (a difference of nearly equal log-probs, the mean
      of values centred on zero) and carries the op's, so the mean of a
      difference is measured against the log-probs it was computed from.

    Gradients (backward and parameters_grad entries) have their own scale:
    a gradient is a product of the incoming gradient and forward tensors
    its entry does not record, and ``d loss / d loss`` (1) carried down the
    backward pass would make every gradient "near zero"."""
    carried: dict[str, float] = {}
    ops: dict[str, list[tuple[Row, str]]] = {}
    for row in rows:
        key, part = entry_parts(row.entry)
        if _FORWARD.search(key):
            ops.setdefault(key, []).append((row, part))
        else:
            row.scale = _own(row)
    for members in ops.values():
        inputs = [row for row, part in members if not part.startswith("output")]
        outputs = [row for row, part in members if part.startswith("output")]
        for row in inputs:
            row.scale = max(_own(row), carried.get(_identity(row), 0.0), carried.get(_identity(row, -1.0), 0.0))
        for row in outputs:
            row.scale = _own(row)
        op = max((row.scale for row, _ in members if _floating(row)), default=0.0)
        for row in outputs:
            own, row.scale = row.scale, max(row.scale, op)
            if _floating(row):
                identity = _identity(row)
                carried[identity] = max(carried.get(identity, 0.0), own if own >= NEAR_ZERO * op else op)


def scaled_distance(row: Row, tolerances: Mapping[str, Tolerance]) -> dict[str, float]:
    """For each statistic both sides of a matched ``row`` have: its distance
    (module docstring), under ``tolerances`` and the row's
    :attr:`~.table.Row.scale` (set it first: :func:`op_scales`).  NaN and Inf
    as :func:`~.tolerance.over_tolerance` (0.0 or inf); an unmatched row has
    none."""
    if not row.matched:
        return {}
    size = row.sizes[1] or row.sizes[0] or 1
    scale = magnitude(row.b_stats)
    floor = NEAR_ZERO * row.scale
    return {
        stat: ratio(a, b, tolerances[stat], scale, floor * math.sqrt(size) if stat == "norm" else floor)
        for stat, a, b in shared_stats(row)
    }
