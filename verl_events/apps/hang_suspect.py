"""The headline of ``verl-events hangs``: which rank to look at first, and why.

A collective waits for every rank, so in a hang the ranks inside one are
usually victims, and the rank to look at is one that is *not* in a
collective.  From what :mod:`.hangs` already knows of each rank against the
stuck stage (its state, the frame and the torch.distributed call its own
hang record names, and whether its process is still there, :mod:`.liveness`),
a rank that has not finished the stage is

* **waiting** when its record names a torch.distributed call (``waiting_in``);
* a **suspect** when its record names a frame outside any collective, when
  it never began the stage, or when it stopped (gone, silent) without
  recording where it was;
* **unknown** otherwise: alive, inside the stage, no frame recorded yet
  (its own deadline has not passed).

A rank ended by ``action: abort`` is judged by where it was when its
deadline passed, as every rank is: its process being gone says nothing more.
A process for which the stage is another kind of process's (``elsewhere``: the
ranks while verl's driver waits for generation, the driver while the ranks
compute) is no suspect, as a rank that finished it is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .read.liveness import Liveness
from .read.ranks import DRIVER_RANK, GENERATION_STAGES, rank_list, rank_name

__all__ = ["Suspect", "suspect"]


class Position(Protocol):
    """What the headline reads of a rank's position (:class:`.hangs.RankPosition`)."""

    @property
    def rank(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def where(self) -> dict[str, Any] | None: ...
    @property
    def waiting_in(self) -> str | None: ...
    @property
    def alive(self) -> Liveness | None: ...


@dataclass(frozen=True, slots=True)
class Suspect:
    """The headline's parts: ``ranks`` suspected (in rank order), and the line itself."""

    ranks: list[int]
    line: str

    def as_json(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "line": self.line}


def suspect(positions: Sequence[Position], stage: str) -> Suspect:
    """The headline for the ranks' ``positions`` against the stuck ``stage``."""
    suspects: list[tuple[int, str]] = []
    waiting: dict[str, list[int]] = {}
    unknown: list[int] = []
    for p in sorted(positions, key=lambda p: p.rank):
        if p.state in ("finished", "elsewhere"):
            continue
        if p.waiting_in is not None:
            waiting.setdefault(p.waiting_in.rsplit(".", 1)[-1], []).append(p.rank)
        elif p.where is not None and p.rank == DRIVER_RANK and stage in GENERATION_STAGES:
            suspects.append((p.rank, "waiting for the rollout's generation (verl's agent loop workers)"))
        elif p.where is not None:
            away = "" if p.state == "inside" else f", never began {stage}"
            suspects.append((p.rank, f"not in a collective{away}"))
        elif p.alive is not None and p.alive.stopped:
            suspects.append((p.rank, f"stopped without saying where ({p.alive.reason})"))
        elif p.state == "never_began":
            suspects.append((p.rank, f"never began {stage}, no frame recorded"))
        else:
            unknown.append(p.rank)
    waits = [f"{rank_list(ranks)} {_verb(ranks)} in {call}" for call, ranks in waiting.items()]
    if unknown:
        waits.append(f"{rank_list(unknown)}: no frame recorded yet (no deadline passed there)")
    if suspects:
        named = "; ".join(f"{rank_name(rank)}, {why}" for rank, why in suspects)
        return Suspect([rank for rank, _ in suspects], f"suspect: {'; '.join([named, *waits])}")
    if waiting and not unknown:
        return Suspect(
            [],
            f"suspect: none here: every rank not done waits in a collective ({'; '.join(waits)}); "
            "look for a rank outside these heartbeats, or for ranks that called collectives in another order",
        )
    if waits:
        return Suspect([], f"suspect: not known yet: {'; '.join(waits)}")
    return Suspect([], f"suspect: none: every rank finished {stage}, late")


def _verb(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"
