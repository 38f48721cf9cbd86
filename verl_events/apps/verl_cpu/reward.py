"""Reward function of the tiny CPU job (``reward.custom_reward_function``).

verl's naive reward manager calls it once per response with the decoded text
(``verl/experimental/reward_loop/reward_manager/naive.py:66-84``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["compute_score"]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float:
    """Fraction of the ground truth's distinct characters that occur in the response.

    A smooth, deterministic score in [0, 1], so that even an untrained random model
    gets rewards that differ between responses.
    """
    wanted = set(ground_truth)
    if not wanted:
        return 0.0
    return len(wanted & set(solution_str)) / len(wanted)
