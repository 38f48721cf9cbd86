"""How the read side names the processes of a run: trainer ranks, and verl's driver.

Every per-rank file is keyed by a rank number.  verl's driver, which is no trainer rank,
files its stages (the wait for generation, ``rollout_generate``) under
:data:`verl_events.DRIVER_RANK` (-1): readers call it ``driver`` and never count it among
the ranks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from verl_events import DRIVER_RANK, rank_name

__all__ = [
    "DRIVER_RANK",
    "FOLDED",
    "GENERATION_STAGES",
    "count_heartbeats",
    "fold_alike",
    "number_ranges",
    "numbers_aside",
    "rank_list",
    "rank_name",
    "ranks_phrase",
    "trainer_ranks",
]

#: This many alike lines or more are folded into one (:func:`fold_alike`).
FOLDED = 3
#: Numbers in a line, which do not make two lines unalike (times, ages, ports).
_NUMBERS = re.compile(r"\d+(\.\d+)?")

#: The driver's stages: its waits for generation (``verl_events.verl.generation``).
GENERATION_STAGES = ("rollout_generate", "rollout_validate")


def trainer_ranks(ranks: Iterable[int]) -> list[int]:
    """The trainer ranks among ``ranks``, in order, each once (the driver left out)."""
    return sorted({rank for rank in ranks if rank != DRIVER_RANK})


def rank_list(ranks: Iterable[int]) -> str:
    """Ranks for a sentence, the driver first: ``driver``, ``rank 1``, ``ranks 0, 1``, ``ranks 0-63``,
    ``driver and ranks 0, 1``."""
    ranks = set(ranks)
    named = ["driver"] if DRIVER_RANK in ranks else []
    numbered = trainer_ranks(ranks)
    if numbered:
        named.append(rank_name(numbered[0]) if len(numbered) == 1 else f"ranks {number_ranges(numbered)}")
    return " and ".join(named)


def number_ranges(numbers: Iterable[int]) -> str:
    """Numbers as ranges, so that a thousand ranks fit on a line: ``0, 1, 4-63``
    (three or more in a row make a range)."""
    parts: list[str] = []
    run: list[int] = []
    for number in sorted(set(numbers)):
        if run and number != run[-1] + 1:
            parts.append(_span(run))
            run = []
        run.append(number)
    if run:
        parts.append(_span(run))
    return ", ".join(parts)


def _span(run: list[int]) -> str:
    return f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run))


def ranks_phrase(ranks: Iterable[int]) -> str:
    """Ranks as the commands list them: ``rank(s) 0, 1``, ``rank(s) 0-63``, ``the driver``,
    ``the driver and rank(s) 0``."""
    ranks = set(ranks)
    numbered = trainer_ranks(ranks)
    listed = f"rank(s) {number_ranges(numbered)}" if numbered else ""
    if DRIVER_RANK not in ranks:
        return listed
    return f"the driver and {listed}" if listed else "the driver"


def count_heartbeats(ranks: Iterable[int]) -> str:
    """How many ranks have a heartbeat, and the driver when it has one: ``2 rank heartbeat(s)``,
    ``1 rank heartbeat(s) and the driver's``."""
    ranks = set(ranks)
    text = f"{len(trainer_ranks(ranks))} rank heartbeat(s)"
    return f"{text} and the driver's" if DRIVER_RANK in ranks else text


def numbers_aside(text: str) -> str:
    """``text`` with its numbers made one mark: lines alike but for times, ages, ports and
    counts give the same."""
    return _NUMBERS.sub("#", text)


def fold_alike(lines: Iterable[tuple[int, str]]) -> list[str]:
    """``(rank, what)`` pairs as lines, the alike folded: three or more ranks whose ``what``
    differs only in its numbers (times, ages, ports) share one line, with the first one's
    ``what``: ``ranks 1-63: inside all_reduce since 12:00:01Z … (63 alike)``."""
    alike: dict[str, list[tuple[int, str]]] = {}
    for rank, what in lines:
        alike.setdefault(numbers_aside(what), []).append((rank, what))
    folded = []
    for group in alike.values():
        rank, what = group[0]
        if len(group) < FOLDED:
            folded += [f"{rank_name(rank)}: {what}" for rank, what in group]
        else:
            folded.append(f"{rank_list(r for r, _ in group)}: {what} ({len(group)} alike; --json lists each)")
    return folded
