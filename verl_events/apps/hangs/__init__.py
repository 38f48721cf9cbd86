"""``verl-events hangs RUN``: from a stuck run to the rank and the line.

Reads what the ``watchdog`` observer left under RUN (its save_path), through
the format's owner (:mod:`verl_events.observers.watchdog.record`): every
rank's heartbeat (its open stages, the last end of each stage) and
``hangs.jsonl`` (one record per stage that passed its deadline, with the
user frame of its thread, and one per such stage that ended late).

**The stuck stage** is the furthest one that passed its deadline: the
highest step, then the most stages begun on its rank (ranks that run the
same stages count alike), then the latest begin.  Every rank with a
heartbeat is then

* **inside** it: the stage is open in its heartbeat (since when, and where,
  from its own record of that stage when its deadline passed there too);
* **finished** it: its heartbeat has that stage ended at that step or later;
* **never began** it: neither; with its last stage (the innermost open one,
  else the last ended) and, when that stage passed its deadline, its frame;
* **elsewhere**: the stage is another kind of process's, so it waits outside it:
  the trainer ranks while verl's driver is stuck in its own stage (the wait for
  generation, ``rollout_generate``), and the driver while the ranks are stuck in
  theirs (:mod:`.ranks`).  These are never suspects.

A heartbeat beats at least every ``liveness_s`` while its process lives
(rewritten, or its mtime set when nothing changed): a rank whose heartbeat
stopped, or whose process is gone, is never called running
(:mod:`.liveness`); it is shown as stopped, with when and where, and
``verl-events diagnose`` says how it ended.  A rank that finished
the stuck stage late still shows where it was when its deadline passed.

The headline under ``HANG`` names the rank to look at first: one not in a
collective while the others wait in one (:mod:`.hang_suspect`).

**Stalls**: a process with no stage open past its deadline (the watchdog's
``stalls.jsonl``), each read against the other ranks' stages (:mod:`.stalls`):
``STALL`` when nothing else was in progress and it never resumed, then those
that resumed, then those that waited on another rank's stage.

Exit codes: 0 no deadline passed, 1 one did (also when the stage ended late
after all, and a stall), 2 bad input (no heartbeats nor stalls, RUN not a
directory).
"""

from .command import add_command, command
from .find import Hangs, HangsInputError, RankPosition, find_hangs
from .render import render

__all__ = ["Hangs", "HangsInputError", "RankPosition", "add_command", "command", "find_hangs", "render"]
