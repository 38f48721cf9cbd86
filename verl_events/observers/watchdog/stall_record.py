"""The watchdog's record of a process that made no progress: ``stalls.jsonl``.

A stage's deadline watches a stage that is open.  A process can also stop
between stages, or before its first one (verl's TransferQueue waiting for
storage units that never come up, a data loader stuck, a Ray call that never
returns): no stage is open, so no stage deadline can pass.  The watchdog puts a
deadline on that idle time too (:mod:`.stall`); when it passes it writes a
report with every thread's stack and one line here, and when a stage begins
again (or the process ends) a second line saying so::

    {save_path}/stalls.jsonl                      one StallRecord per line, every process
    {save_path}/hangs/stall_pid4242_1.txt         one report per stall, every thread's stack

A line (``kind`` ``"stall"`` when the idle deadline passed, ``"resumed"``
when that idle time ended: ``next`` is the stage that began, or None when the
process ended, ``how`` saying how)::

    {"kind": "stall", "run": "…", "time": 1796025967.1, "pid": 4242, "host": "node7",
     "process": "ray::WorkerDict.actor_rollout_compute_log_prob", "ranks": [1],
     "after": {"stage": "update_weights", "step": 4, "rank": 1},
     "began": 1796025667.1, "elapsed_s": 300.0, "deadline_s": 300.0, "deadline": "adaptive",
     "thread": "MainThread", "where": {"file": "…", "line": 88, "function": "fit", "code": "…"},
     "waiting_in": null, "report": "hangs/stall_pid4242_1.txt", "next": null, "how": null}

``process`` is the process's command line as ``ps`` shows it (Ray names an
actor's process by its task: ``ray::TaskRunnerV1.run`` is verl's driver),
at most 200 characters; ``after`` is the last stage that ended in the process (None: it had begun
none since the watchdog was installed); ``ranks`` the ranks the process had
run stages for (before its first stage, the ``RANK`` of its environment, if
any); ``began`` when the idle time began (the installation, or ``after``'s
end); ``waiting_in`` the ``torch.distributed`` call, or ``ray.get`` /
``ray.wait``, its thread waits in below its user frame; ``elapsed_s`` the idle time when the deadline was seen to pass
(``stall``) or in all (``resumed``).  Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import Record

__all__ = [
    "STALLS_LOG",
    "STALL_KINDS",
    "STALL_REPORT_PREFIX",
    "NotAStallRecord",
    "StallRecord",
    "finite_number",
    "new_stall_report_path",
    "stalls_log_path",
]

#: The file under ``save_path`` every process appends its stalls to.
STALLS_LOG = "stalls.jsonl"
#: How every stall report's name begins (a hang report's begins with its step).
STALL_REPORT_PREFIX = "stall_"
#: ``stall``: the idle deadline passed; ``resumed``: that idle time ended.
STALL_KINDS = ("stall", "resumed")


def stalls_log_path(save_path: Path) -> Path:
    """``{save_path}/stalls.jsonl``."""
    return Path(save_path) / STALLS_LOG


def new_stall_report_path(folder: Path, pid: int) -> Path:
    """A report file of process ``pid`` under ``folder`` (the hang reports'
    folder) that does not exist yet: ``stall_pid{P}_{n}.txt``."""
    n = 1
    while (folder / f"{STALL_REPORT_PREFIX}pid{pid}_{n}.txt").exists():
        n += 1
    return folder / f"{STALL_REPORT_PREFIX}pid{pid}_{n}.txt"


class NotAStallRecord(ValueError):
    """A line that is not a stall record; the message says what it lacks or what is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StallRecord(Record):
    """One line of ``stalls.jsonl`` (see the module docstring)."""

    kind: str
    run: str | None
    time: float
    pid: int
    host: str | None = None
    process: str | None = None
    ranks: list[int]
    after: dict[str, Any] | None = None
    began: float
    elapsed_s: float
    deadline_s: float
    deadline: str = "fixed"
    thread: str | None = None
    where: dict[str, Any] | None = None
    waiting_in: str | None = None
    report: str | None = None
    next: dict[str, Any] | None = None
    how: str | None = None

    @property
    def key(self) -> tuple[str | None, int, float]:
        """What a stall and its ``resumed`` line share: the process and when its idle time began."""
        return (self.host, self.pid, self.began)

    noun = "a stall record"
    refused = NotAStallRecord
    required = ("kind", "time", "pid", "ranks", "began", "elapsed_s", "deadline_s")
    not_negative = ("elapsed_s", "deadline_s")
    choices = {"kind": STALL_KINDS}

    @classmethod
    def from_json(cls, line: str | bytes) -> StallRecord:
        """Parse one line; NotAStallRecord (a ValueError) when it is not a stall record, naming the field."""
        data = cls.parsed(line)
        if isinstance(data["deadline_s"], (int, float)) and data["deadline_s"] == 0:
            raise NotAStallRecord("its deadline_s is 0, and a deadline is above 0")
        return cls.known(data)


def finite_number(value: object) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None: how the stall
    readers take a number from a file another process wrote."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
