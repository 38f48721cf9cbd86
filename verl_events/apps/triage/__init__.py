"""``verl-events triage RUN``: from a recorded anomaly to the op behind it.

* :mod:`.command`: the command (:func:`triage`), reading the sentinel's
  anomaly records;
* :mod:`.replay`: the sentinel's verdict on a replayed stage (replays.jsonl)
  and the replay's own dump, searched first;
* :mod:`.render`: the command's arguments and exit codes, and the lines
  it prints (:func:`render`);
* :mod:`.dumps`: what triage reads of an msprobe dump, and which frame is the user's;
* :mod:`.non_finite` and :mod:`.spike`: the searches for a ``non_finite``
  anomaly and for a ``spike`` (or ``above``/``below``);
* :mod:`.finding`: the op named, placed in its module and source line.
"""

from .command import Anomaly, Triage, TriageInputError, is_library_frame, read_anomalies, triage, user_frame
from .render import render

__all__ = [
    "Anomaly",
    "Triage",
    "TriageInputError",
    "is_library_frame",
    "read_anomalies",
    "render",
    "triage",
    "user_frame",
]
