"""The memory logs' line in ``verl-events diagnose``: the highest peak a stage reached, on
which rank at which step, the device's where there was one, and the stages that leak (the
figures of ``report``'s memory table, :mod:`.memory`)."""

from __future__ import annotations

from verl_events.observers.memory import record as memory_record

from ..read import large_logs
from ..read.jsonl import read_records
from ..read.ranks import rank_name
from ..read.record import Evidence
from ..tools import Holding
from .memory import StageMemory, stage_memory
from .steps import STAGE_ORDER

__all__ = ["memory_headline"]


def memory_headline(evidence: Evidence, holding: Holding) -> str:
    """``4 memory log(s): the highest host peak 812 MB (rank 1, step 3's actor_update); leak:
    actor_update keeps 12.0 MB a step``.  Logs past :data:`~..read.large_logs.FULL_READ_BYTES`
    in all are not read (``report`` reads them) unless ``diagnose --read-all``."""
    size = large_logs.total_bytes(holding.files)
    if not evidence.read_all and size > large_logs.FULL_READ_BYTES:
        return f"{holding.describe()}, {size / 2**30:.2f} GiB: the peaks by stage are report's (not read here)"
    records = []
    for path in holding.files:
        # The lines that are not records, diagnose warns of where a death needs them; here they count for nothing.
        for _, record in read_records(path, memory_record.MemoryRecord, []):
            if evidence.run_id is None or record.run == evidence.run_id:
                records.append(record)
    rows = stage_memory(records, list(STAGE_ORDER))
    if not rows:
        return f"{holding.describe()}, no stage that ended with a peak"
    return f"{holding.describe()}: {_peaks(rows)}{_leaks(rows)}"


def _peaks(rows: list[StageMemory]) -> str:
    top = max(rows, key=lambda row: row.host_peak_max_mb)
    where = f"{rank_name(top.host_peak_max_rank)}, step {top.host_peak_max_step}'s {top.stage}"
    said = f"the highest host peak {top.host_peak_max_mb:.0f} MB ({where})"
    device = [row for row in rows if row.device_peak_max_mb is not None]
    if device:
        most = max(device, key=lambda row: row.device_peak_max_mb or 0.0)
        said += f", device peak {most.device_peak_max_mb:.0f} MB (in {most.stage})"
    return said


def _leaks(rows: list[StageMemory]) -> str:
    leaks = [f"{row.stage} keeps {row.kept_median_mb:.1f} MB a step" for row in rows if row.leak]
    return f"; leak: {', '.join(leaks)}" if leaks else ""
