"""What the report shows, however it was computed: :class:`ReportParts`."""

from __future__ import annotations

from dataclasses import dataclass

from ..read.overhead import ObserverHooks, StageOverhead
from .headline import Headline
from .memory import StageMemory
from .raised import RaisedStage
from .steps import StageStep
from .stragglers import StageStragglers

__all__ = ["ReportParts"]


@dataclass(frozen=True, slots=True)
class ReportParts:
    """What the report shows, however it was computed (record by record here, or by the
    columnar engine, :mod:`.columnar`): ``records`` and ``ranks`` count every record,
    ``runs`` are the run ids in order of appearance; the tables are of the records of
    stages that did not raise, ``raised`` counts the others per stage."""

    records: int
    ranks: list[int]
    runs: list[str]
    headline: Headline
    stage_steps: list[StageStep]
    overhead: list[StageOverhead]
    observer_hooks: list[ObserverHooks]
    stragglers: list[StageStragglers]
    raised: list[RaisedStage]
    memory: list[StageMemory]
