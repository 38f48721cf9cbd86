"""When two statistics are close: :class:`Tolerance`, the defaults, and the verdict on a row.

Close means ``|a - b| <= atol * magnitude + rtol * |b|`` as in
``numpy.isclose``, with ``atol`` a fraction of the tensor's largest |value|
(:func:`magnitude`); NaN and +/-Inf are close only to themselves.  msprobe's
relative errors are not used: they are infinite whenever B's statistic is
exactly 0, and no tolerance could loosen that.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from .table import STATS, Row

__all__ = [
    "DEFAULT_TOLERANCES",
    "Tolerance",
    "judge",
    "magnitude",
    "over_tolerance",
    "ratio",
    "resolve_tolerances",
    "shared_stats",
]


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far one statistic may move: A's value ``a`` is close to B's ``b`` when

        |a - b| <= atol * magnitude + rtol * |b|

    where ``magnitude`` is the tensor's largest |value| on side B (see
    :func:`magnitude`).  ``atol`` is a fraction of that magnitude rather than
    an absolute number, so one setting fits activations and gradients a
    million times smaller.  NaN is close only to NaN, +Inf only to +Inf and
    -Inf only to -Inf, whatever the tolerance.  Both fields must be finite
    and >= 0, or ValueError."""

    rtol: float
    atol: float = 0.0

    def __post_init__(self) -> None:
        for kind in ("rtol", "atol"):
            value = getattr(self, kind)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a tolerance's {kind} must be a finite number >= 0, got {value!r}")

    def allowed(self, b: float, magnitude: float, floor: float = 0.0) -> float:
        """The largest |a - b| still close to ``b``; with a ``floor``, |b|
        counts as at least that (the worst list's ranking, see
        :mod:`.distance`; the verdict uses none)."""
        return self.atol * magnitude + self.rtol * max(abs(b), floor)


#: The default tolerances, the one source for compare, its CLI flags and the
#: docs.  Norm is the most telling statistic, so the tightest.  The mean of a
#: tensor centred on zero is cancellation noise of the order of its values'
#: magnitude, so it gets an atol of 1e-3 of that magnitude: a layer norm's
#: mean of 1e-9 in one run and exactly 0.0 in the other is no divergence,
#: while a shift of the whole tensor by 0.1 % of its largest value is.
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = MappingProxyType(
    {
        "max": Tolerance(rtol=0.01),
        "min": Tolerance(rtol=0.01),
        "mean": Tolerance(rtol=0.01, atol=0.001),
        "norm": Tolerance(rtol=0.001),
    }
)


def resolve_tolerances(
    rtol: Mapping[str, float | None] | None = None, atol: Mapping[str, float | None] | None = None
) -> dict[str, Tolerance]:
    """:data:`DEFAULT_TOLERANCES` with the given per-statistic overrides (a
    ``None`` value keeps the default).  Raises ValueError, naming the statistic
    and the value, for a statistic not in :data:`STATS` or a value that is not
    a finite number >= 0."""
    resolved = dict(DEFAULT_TOLERANCES)
    for kind, overrides in (("rtol", rtol or {}), ("atol", atol or {})):
        for stat, value in overrides.items():
            if stat not in resolved:
                raise ValueError(
                    f"compare has no statistic {stat!r} to give an {kind}; the statistics are {', '.join(STATS)}"
                )
            if value is None:
                continue
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"the {kind} of {stat} must be a finite number >= 0, got {value!r}")
            resolved[stat] = replace(resolved[stat], **{kind: value})
    return resolved


def magnitude(stats: Mapping[str, float | None]) -> float:
    """The tensor's largest |value|: max(|max|, |min|) over those that are
    known and finite, 0.0 when neither is."""
    return max((abs(v) for s in ("max", "min") if (v := stats.get(s)) is not None and math.isfinite(v)), default=0.0)


def _close(a: float, b: float, tolerance: Tolerance, scale: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tolerance.allowed(b, scale)


def ratio(a: float, b: float, tolerance: Tolerance, scale: float, floor: float = 0.0) -> float:
    """|a - b| over its tolerance (``floor`` as for :meth:`Tolerance.allowed`);
    0.0 for equal values (NaN and NaN included), inf for a NaN/Inf on one
    side only or a difference where nothing is allowed."""
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return 0.0 if _close(a, b, tolerance, scale) else math.inf
    diff, allowed = abs(a - b), tolerance.allowed(b, scale, floor)
    if diff == 0.0:
        return 0.0
    return diff / allowed if allowed > 0.0 else math.inf


def shared_stats(row: Row) -> list[tuple[str, float, float]]:
    """The statistics both sides have (msprobe writes N/A for non-tensors and
    no mean or norm for integer tensors)."""
    return [(s, a, b) for s in STATS if (a := row.a_stats.get(s)) is not None and (b := row.b_stats.get(s)) is not None]


def judge(row: Row, tolerances: Mapping[str, Tolerance]) -> str:
    """Why ``row`` diverges, or "" when it does not: an entry on one side
    only, a dtype mismatch, or each statistic not close under ``tolerances`` (one per
    name in :data:`STATS`), as :class:`Tolerance` defines close.  A statistic
    missing on either side is not judged."""
    if not row.matched:
        return f"only in {row.side}"
    a_dtype, b_dtype = row.dtypes
    if a_dtype not in ("", "N/A") and b_dtype not in ("", "N/A") and a_dtype != b_dtype:
        return f"dtype {a_dtype} vs {b_dtype}"
    scale = magnitude(row.b_stats)
    reasons = []
    for stat, a, b in shared_stats(row):
        tolerance = tolerances[stat]
        if _close(a, b, tolerance, scale):
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            reasons.append(f"{stat} is {a} in A but {b} in B")
            continue
        diff, allowed = abs(a - b), tolerance.allowed(b, scale)
        reasons.append(
            f"{stat} {a:.6g} in A vs {b:.6g} in B: off by {diff:.3g}"
            + (f", {diff / allowed:.3g}x its tolerance {allowed:.3g}" if allowed > 0 else ", where its tolerance is 0")
        )
    return "; ".join(reasons)


def over_tolerance(row: Row, tolerances: Mapping[str, Tolerance]) -> dict[str, float]:
    """For each statistic both sides of a matched ``row`` have: |a - b| over
    its tolerance.  Above 1 is a divergence; 0.0 means equal; inf means a
    NaN/Inf on one side only, or a difference where the tolerance is 0.  An
    unmatched row has none."""
    if not row.matched:
        return {}
    scale = magnitude(row.b_stats)
    return {stat: ratio(a, b, tolerances[stat], scale) for stat, a, b in shared_stats(row)}
