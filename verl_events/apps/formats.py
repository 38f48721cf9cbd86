"""The on-disk formats the tools read, each from the one module that owns it.

* :data:`msprobe_layout`: msprobe's sessions (:mod:`verl_events.observers.msprobe.layout`);
* :data:`timing_log`: the timing log and its record (:mod:`verl_events.observers.timing`);
* :data:`anomaly_record`: the sentinel's record (:mod:`verl_events.observers.sentinel.record`);
* :data:`hang_record`: the watchdog's hang records, reports and heartbeats
  (:mod:`verl_events.observers.watchdog.record`);
* :data:`stall_record`: the watchdog's records of a process with no stage open
  past its deadline (:mod:`verl_events.observers.watchdog.stall_record`);
* :data:`crash_record`: the watchdog's records of how a process ended badly
  (:mod:`verl_events.observers.watchdog.crash`);
* :data:`mismatch_record`: the mismatch observer's log
  (:mod:`verl_events.observers.mismatch.record`);
* :data:`weight_sync_record`: the weight_sync observer's ledger
  (:mod:`verl_events.observers.weight_sync.record`);
* :data:`memory_record`: the memory observer's logs
  (:mod:`verl_events.observers.memory.record`).

The tools import them from here, in one place, because mypy checks the
repository's observers/ folder as the package ``observers`` ([tool.mypy] in
pyproject.toml) and cannot follow its installed name, ``verl_events.observers``:
one module, two names.  None of them imports a tool library.
"""

from __future__ import annotations

from verl_events.observers import timing as timing_log
from verl_events.observers.memory import record as memory_record
from verl_events.observers.mismatch import record as mismatch_record
from verl_events.observers.msprobe import layout as msprobe_layout
from verl_events.observers.sentinel import record as anomaly_record
from verl_events.observers.watchdog import crash as crash_record
from verl_events.observers.watchdog import record as hang_record
from verl_events.observers.watchdog import stall_record
from verl_events.observers.weight_sync import record as weight_sync_record

__all__ = [
    "anomaly_record",
    "crash_record",
    "hang_record",
    "memory_record",
    "mismatch_record",
    "msprobe_layout",
    "stall_record",
    "timing_log",
    "weight_sync_record",
]
