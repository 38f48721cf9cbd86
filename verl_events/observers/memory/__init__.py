"""Memory per stage: host, cgroup and device.

* :mod:`.observer`: :class:`MemoryObserver`;
* :mod:`.host`, :mod:`.cgroup`, :mod:`.device`: where the figures come from;
* :mod:`.peaks`: a stage's peak from a process-wide one;
* :mod:`.record`: :class:`MemoryRecord`, one line of ``memory/rank{R}.jsonl``
  (standard library only, for the readers).
"""

from .observer import MemoryObserver
from .record import MEMORY_DIR, MemoryRecord, NotAMemoryRecord, memory_files, memory_log_path

__all__ = ["MEMORY_DIR", "MemoryObserver", "MemoryRecord", "NotAMemoryRecord", "memory_files", "memory_log_path"]
