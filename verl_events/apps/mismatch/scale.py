"""What a mean |Δ log p| means, for the reader of ``verl-events mismatch`` who has no feel for
it: the probability difference it stands for, and PPO's clip as a yardstick.

A log-prob gap d is a factor e^d between the two sides' probabilities of a token, so a mean
gap of 0.01 is about a 1 % difference (at least that: the mean of e^|d| is never below e^ of
the mean).  PPO clips the ratio of the new policy to the old at 1 ± ε (verl's
``actor.clip_ratio``, 0.2 by default), a |log ratio| of log(1 + ε) = 0.182: a token whose
rollout and trainer log-probs are that far apart is at the clip before any update, so the
rollout's sample is no longer on the trainer's policy for it."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["CLIP_RATIO", "scale_line"]

#: verl's default ``actor_rollout_ref.actor.clip_ratio``.
CLIP_RATIO = 0.2


def scale_line(trend: list[dict[str, Any]]) -> str | None:
    """``scale: …`` over the steps of ``trend`` (each with its tokens, mean, p99 and max), or
    None when no step had a token to compare."""
    tokens = sum(step["tokens"] for step in trend)
    if not tokens:
        return None
    mean = sum(step["mean"] * step["tokens"] for step in trend) / tokens
    clip = math.log(1 + CLIP_RATIO)
    past = [step["step"] for step in trend if step["p99"] >= clip]
    line = (
        f"scale: a mean |Δ log p| of {mean:.3g} is a {math.expm1(mean):.2%} difference in a token's probability "
        f"(e^|Δ|); PPO's clip (ε = {CLIP_RATIO:g}) is |Δ| = {clip:.3g}"
    )
    if past:
        return line + f": at least 1 % of the tokens are past it at step(s) {', '.join(map(str, past))}"
    worst = max(step["max"] for step in trend)
    where = "past it" if worst >= clip else "within it"
    return line + f"; the largest gap, {worst:.3g}, is {where}"
