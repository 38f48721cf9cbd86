"""The watchdog: a deadline on every open stage, a report when one passes.

* :mod:`.observer`: :class:`WatchdogObserver`, its options and its hooks;
* :mod:`.monitor`: the one monitor thread: deadlines, reports, heartbeats, abort;
* :mod:`.table`: what the hooks and that thread share, under one lock;
* :mod:`.stall`: the deadline on a process's time with no stage open;
  :mod:`.stall_record` its file, ``stalls.jsonl``;
* :mod:`.stacks`: every thread's stack, the user's frame, the pending collective;
* :mod:`.record`: the files it writes (``hangs.jsonl``, the reports, the
  heartbeats), for ``verl-events hangs`` (standard library only).
"""

from .monitor import ABORT_EXIT_CODE
from .observer import WatchdogObserver
from .record import HANGS_LOG, HangRecord, Heartbeat, hangs_log_path, heartbeat_path

__all__ = [
    "ABORT_EXIT_CODE",
    "HANGS_LOG",
    "HangRecord",
    "Heartbeat",
    "WatchdogObserver",
    "hangs_log_path",
    "heartbeat_path",
]
