"""The spike rule at work: each new value of a metric judged against its recent history.

A spike must be both **unusual** for this metric and **large**.  A value
``x`` of a metric at a stage is judged against the last ``window`` finite
values of that metric at that stage, with median ``m`` and
``MAD = median(|x_i - m|)``:

* *unusual*: its robust z-score (Iglewicz and Hoaglin's modified z)::

      z = 0.6745 * |x - m| / max(MAD, 0.05 * |m|, 1e-12)

  exceeds ``z``;
* *large*: it is at least ``ratio`` times the median (``up``), or at most
  ``1/ratio`` of it (``down``).  Written for any sign of the median, the
  move must reach ``(ratio - 1) * |m|`` upwards or ``(1 - 1/ratio) * |m|``
  downwards; for a positive median that is ``x >= ratio * m`` and
  ``x <= m / ratio``.

Only moves in the rule's ``direction`` (``up``, ``down`` or ``both``) count.
Every finite value joins the history after it is judged, spikes included:
the median shrugs a few of them off.

The defaults, and why (measured margins of healthy runs are in
docs/sentinel.md, "How far healthy runs stay from the limits"):

* ``direction: up``.  The metrics a spike rule is for are norms and losses
  (``actor/grad_norm``, ``critic/vf_loss``, ``actor/kl_loss``,
  ``gap/log_prob_abs_max``), where trouble is a rise.  A healthy gradient
  norm falls as often as it rises (-17 % in one step of a small GPT-2), so
  ``both`` raised alarms on good news.  Use ``down`` for a metric whose
  trouble is a fall (an entropy collapse).
* ``ratio: 2``.  Large means at least twice the median (half of it
  downwards).  The healthy runs measured stay within x1.5 of their median;
  the demo's injected x50 weight doubles its gradient norm.  Lightning's
  ``SpikeDetection`` has a relative tolerance too (``rtol=2``: three times
  its reference), but its reference is a running mean, which a spike drags
  up for the values after it, and it has no notion of the metric's spread;
  here the median is not moved by a spike, and the z-score must agree.
* ``z: 6``.  Unusual means six robust standard deviations (``MAD /
  0.6745`` estimates one for normal data): rare even for a metric with
  heavier tails than a normal.
* The scale floor, ``5 %`` of ``|median|``.  A few values can have a MAD far
  below the metric's real noise (three gradient norms had a MAD of 0.3 % of
  their median, which made a 17 % change score z = 33); the noise is never
  taken as less than 5 % of the level.  At z 6 the floor alone asks for a
  move of 6 / 0.6745 * 5 % = 44.5 % of the median, just inside what the
  ratio 2 asks (50 % down, 100 % up): on a quiet metric the ratio decides,
  on a noisy one the z-score.  ``1e-12`` keeps a metric stuck at 0 from
  dividing by zero.
* ``warmup: 4`` **steps**.  Values are judged from the fifth step on: the
  first steps are the least typical of a run (fresh weights or a checkpoint
  just loaded, optimizer moments starting from zero), and the median of four
  values cannot be moved by one odd first value.  Counted in steps, not
  values, so that a stage that runs once per mini-batch (``train_batch``)
  warms up over the same steps as one that runs once per step (a value
  whose step is unknown counts as a step of its own).  Not longer, because
  a spike during the warm-up is not judged (the NaN/inf rule and the
  thresholds judge from the first step).
* ``window: 50`` values.  Long enough for a steady median and MAD, short
  enough to follow a metric that drifts over hundreds of steps.

A median of 0 gives the relative floor no scale: then the z-score alone
decides.  A metric that sits at 0 or crosses it (``actor/pg_loss``, a KL
estimate) is better watched with ``above`` / ``below``.

Each history also keeps its **margin**: how close the values it judged came
to the limits (:class:`SpikeMargin`), for a healthy run to show how much
room the rule leaves.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .rules import SpikeRule

__all__ = ["SCALE_FLOOR", "SpikeHistory", "SpikeMargin"]

#: The noise of a metric is never taken as less than this fraction of ``|median|``.
SCALE_FLOOR = 0.05
_TINY = 1e-12
_Z = 0.6745  # MAD / 0.6745 estimates the standard deviation of normal data


def _median(ordered: list[float]) -> float:
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _ratio_up(value: float, median: float) -> float:
    """How many times the median ``value`` is, upwards (``value / median`` for a
    positive median); 1 for a value not above the median."""
    if value <= median:
        return 1.0
    return math.inf if median == 0 else 1 + (value - median) / abs(median)


def _ratio_down(value: float, median: float) -> float:
    """How many times smaller than the median ``value`` is (``median / value``
    for a positive median); 1 for a value not below the median."""
    if value >= median:
        return 1.0
    left = 1 - (median - value) / abs(median) if median != 0 else 0.0
    return math.inf if left <= 0 else 1 / left


def moved_as_far(rule: SpikeRule, value: float, median: float) -> bool:
    """Whether ``value`` is again as large a move from ``median`` as the rule
    calls a spike (its ratio, in its direction): how a replay's value is judged
    against the median the anomaly was judged by."""
    up = rule.direction != "down" and _ratio_up(value, median) >= rule.ratio
    down = rule.direction != "up" and _ratio_down(value, median) >= rule.ratio
    return up or down


def _sizes(up: bool, median: float, ratio: float, limit: float) -> tuple[str, str]:
    """How a spike's size is said: ``x8`` / ``1/8 of`` for a positive median;
    for a median of 0 or below, "x3 the median" would mislead, so how far it
    moved, in units of the median's size."""
    if median > 0:
        return (f"x{ratio:.3g}", f"x{limit:g}") if up else (f"1/{ratio:.3g} of", f"1/{limit:g}")
    word = "above" if up else "below"
    if median == 0:
        return word, "any move"
    move, least = (ratio - 1, limit - 1) if up else (1 - 1 / ratio, 1 - 1 / limit)
    return f"{move:.3g}x its size {word}", f"{least:.3g}x its size"


@dataclass(frozen=True, slots=True)
class SpikeMargin:
    """How close one metric at one stage came to its spike rule.

    ``judged``: values judged (after the warm-up).  ``ratio`` and ``z``: the
    largest ratio and robust z of a judged value in the rule's direction
    (1 and 0 when none moved that way; None when nothing was judged), each
    with the step it was seen at.  A value fires when its own ratio reaches
    ``rule.ratio`` and its own z exceeds ``rule.z``.
    """

    stage: str
    metric: str
    rule: SpikeRule
    judged: int
    ratio: float | None = None
    ratio_step: int | None = None
    z: float | None = None
    z_step: int | None = None

    def describe(self) -> str:
        """One line: ``actor/grad_norm at actor_update: 16 values judged, the largest ratio x1.05 (step 9)...``."""
        head = f"{self.metric} at {self.stage}: "
        if self.ratio is None or self.z is None:
            return head + f"no value judged yet (the warm-up is {self.rule.warmup} steps)"
        return head + (
            f"{self.judged} values judged, the largest ratio x{self.ratio:.3g} (step {self.ratio_step}; "
            f"a spike needs x{self.rule.ratio:g}), the largest robust z {self.z:.3g} (step {self.z_step}; "
            f"a spike needs more than {self.rule.z:g}), direction {self.rule.direction}"
        )


class SpikeHistory:
    """One metric's recent values at one stage, and its margin.

    Not thread safe: the sentinel calls it with its lock held.
    """

    __slots__ = ("_last", "_steps", "judged", "ratio", "ratio_step", "rule", "values", "z", "z_step")

    def __init__(self, rule: SpikeRule) -> None:
        self.rule = rule
        self.values: deque[float] = deque(maxlen=rule.window)
        self._steps = 0  # distinct steps whose values joined the history
        self._last: object = None  # the key of the last of them
        self.judged = 0
        self.ratio: float = 1.0
        self.ratio_step: int | None = None
        self.z: float = 0.0
        self.z_step: int | None = None

    def observe(self, value: float, when: tuple[str, int], step: int | None) -> tuple[float, str] | None:
        """Judge the finite ``value`` (``when``: its step, or its stage's sequence
        number when the step is unknown), then add it.  ``(median, detail)``
        when it is a spike, else None."""
        rule = self.rule
        earlier_steps = self._steps - 1 if when == self._last else self._steps
        found = None
        if earlier_steps >= rule.warmup:
            found = self._judge(value, step)
        self.values.append(value)
        if when != self._last:
            self._steps += 1
            self._last = when
        return found

    def _judge(self, value: float, step: int | None) -> tuple[float, str] | None:
        rule = self.rule
        median = _median(sorted(self.values))
        mad = _median(sorted([abs(x - median) for x in self.values]))
        scale = max(mad, SCALE_FLOOR * abs(median), _TINY)
        up = rule.direction != "down" and value > median
        down = rule.direction != "up" and value < median
        ratio = _ratio_up(value, median) if up else _ratio_down(value, median) if down else 1.0
        z = _Z * abs(value - median) / scale if up or down else 0.0
        self.judged += 1
        if ratio > self.ratio:
            self.ratio, self.ratio_step = ratio, step
        if z > self.z:
            self.z, self.z_step = z, step
        if not (ratio >= rule.ratio and z > rule.z):
            return None
        size, needs = _sizes(up, median, ratio, rule.ratio)
        return (
            median,
            f"{size} the median {median:g} of the last {len(self.values)} values, robust z {z:.3g} (MAD {mad:g}); "
            f"a spike needs {needs} and z above {rule.z:g}",
        )

    def margin(self, stage: str, metric: str) -> SpikeMargin:
        if not self.judged:
            return SpikeMargin(stage, metric, self.rule, 0)
        return SpikeMargin(stage, metric, self.rule, self.judged, self.ratio, self.ratio_step, self.z, self.z_step)
