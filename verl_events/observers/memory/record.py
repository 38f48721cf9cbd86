"""The memory observer's records, ``{save_path}/memory/rank{R}.jsonl``: one line per stage and rank.

This module owns the format; the ``memory`` observer writes it and the
readers read it back through the names here.  A line is a
:class:`MemoryRecord`::

    {"run": "ray-0a1b", "step": 2, "stage": "actor_update", "rank": 0, "role": "actor",
     "time": 1796025667.1, "pid": 4242, "error": null,
     "host_begin_bytes": 1288490188, "host_peak_bytes": 1825361100, "host_end_bytes": 1290000000,
     "host_peak": "reset",
     "device_peak_bytes": null, "device": null,
     "cgroup": {"version": 1, "path": "/sys/fs/cgroup/memory/job", "limit_bytes": null,
                "usage_bytes": 6012928000, "oom_kills": 0}}

``host_peak`` says how the host peak was taken: ``reset`` (the process's
``VmHWM``, reset when the stage began: no spike is missed), ``sampled``
(``VmHWM`` reset and read by the observer's thread every interval: no
spike is missed, and the peak also covers the intervals the stage began
and ended in) or ``begin_end`` (the larger of the two figures: a spike
between them is missed).
``device`` holds ``kind`` (cuda, npu), ``allocated_begin``,
``allocated_end``, ``reserved_begin``, ``reserved_end``, ``peak_allocated``,
``peak_reserved``, ``used`` and ``total`` (the whole device's, every
process's); ``device_peak_bytes`` is ``peak_allocated``.  ``oom`` is set
when the stage raised an out-of-memory error (:mod:`.oom`): ``device``
(cpu, cuda, npu or null) and ``asked_bytes`` (null when the message has
no size).  ``tokens`` is the step's token count the forecast used (null
without one) and ``forecast`` the warnings given when the stage began
(:mod:`.forecast`: ``kind``, ``tokens``, ``expected_bytes``,
``headroom_bytes``, ``limit``, ``seen_tokens``, ``seen_bytes``), or null.
Lines are appended
with one ``write`` each.  Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import Record

__all__ = ["MEMORY_DIR", "MemoryRecord", "NotAMemoryRecord", "memory_files", "memory_log_path", "oom_snapshot_path"]

MEMORY_DIR = "memory"


def memory_log_path(save_path: Path, rank: int) -> Path:
    return Path(save_path) / MEMORY_DIR / f"rank{rank}.jsonl"


def oom_snapshot_path(save_path: Path, rank: int, step: int | None, stage: str) -> Path:
    """Where a CUDA allocator snapshot taken at an out-of-memory goes (``record_history``)."""
    return Path(save_path) / MEMORY_DIR / f"oom_rank{rank}_step{step}_{stage}.pickle"


def memory_files(save_path: Path) -> list[Path]:
    """Every rank's memory log under ``save_path``, by rank."""
    folder = Path(save_path) / MEMORY_DIR
    return sorted(folder.glob("rank*.jsonl"), key=lambda p: (len(p.name), p.name)) if folder.is_dir() else []


class NotAMemoryRecord(ValueError):
    """A line that is not a memory record; the message says what it lacks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRecord(Record):
    """One stage on one rank (see the module docstring)."""

    run: str
    step: int | None
    stage: str
    rank: int
    role: str | None
    time: float
    pid: int
    error: str | None
    host_begin_bytes: int | None
    host_peak_bytes: int | None
    host_end_bytes: int | None
    host_peak: str
    device_peak_bytes: int | None
    device: dict[str, Any] | None
    cgroup: dict[str, Any] | None
    oom: dict[str, Any] | None = None
    tokens: int | None = None
    forecast: list[dict[str, Any]] | None = None

    noun = "a memory record"
    not_negative = ("host_begin_bytes", "host_peak_bytes", "host_end_bytes", "device_peak_bytes", "tokens")
    refused = NotAMemoryRecord
    # Every field but those added later (oom, tokens, forecast).
    required = (
        "run",
        "step",
        "stage",
        "rank",
        "role",
        "time",
        "pid",
        "error",
        "host_begin_bytes",
        "host_peak_bytes",
        "host_end_bytes",
        "host_peak",
        "device_peak_bytes",
        "device",
        "cgroup",
    )
