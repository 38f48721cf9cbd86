"""How the read side names the processes of a run: trainer ranks, and verl's driver.

Every per-rank file is keyed by a rank number.  verl's driver, which is no trainer rank,
files its stages (the wait for generation, ``rollout_generate``) under
:data:`verl_events.DRIVER_RANK` (-1): readers call it ``driver`` and never count it among
the ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

from verl_events import DRIVER_RANK, rank_name

__all__ = [
    "DRIVER_RANK",
    "GENERATION_STAGES",
    "count_heartbeats",
    "rank_list",
    "rank_name",
    "ranks_phrase",
    "trainer_ranks",
]

#: The driver's stages: its waits for generation (``verl_events.verl.generation``).
GENERATION_STAGES = ("rollout_generate", "rollout_validate")


def trainer_ranks(ranks: Iterable[int]) -> list[int]:
    """The trainer ranks among ``ranks``, in order, each once (the driver left out)."""
    return sorted({rank for rank in ranks if rank != DRIVER_RANK})


def rank_list(ranks: Iterable[int]) -> str:
    """Ranks for a sentence, the driver first: ``driver``, ``rank 1``, ``ranks 0, 1``,
    ``driver and ranks 0, 1``."""
    ranks = set(ranks)
    named = ["driver"] if DRIVER_RANK in ranks else []
    numbered = trainer_ranks(ranks)
    if numbered:
        named.append(rank_name(numbered[0]) if len(numbered) == 1 else f"ranks {', '.join(map(str, numbered))}")
    return " and ".join(named)


def ranks_phrase(ranks: Iterable[int]) -> str:
    """Ranks as the commands list them: ``rank(s) 0, 1``, ``the driver``, ``the driver and rank(s) 0``."""
    ranks = set(ranks)
    numbered = trainer_ranks(ranks)
    listed = f"rank(s) {', '.join(map(str, numbered))}" if numbered else ""
    if DRIVER_RANK not in ranks:
        return listed
    return f"the driver and {listed}" if listed else "the driver"


def count_heartbeats(ranks: Iterable[int]) -> str:
    """How many ranks have a heartbeat, and the driver when it has one: ``2 rank heartbeat(s)``,
    ``1 rank heartbeat(s) and the driver's``."""
    ranks = set(ranks)
    text = f"{len(trainer_ranks(ranks))} rank heartbeat(s)"
    return f"{text} and the driver's" if DRIVER_RANK in ranks else text
