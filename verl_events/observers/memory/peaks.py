"""A stage's peak from a gauge whose peak can only be reset for the whole process.

The host's ``VmHWM`` and torch's allocator peaks are process-wide: resetting
them when a stage begins would lose what a stage already open (an enclosing
one, or one on another thread) reached so far.  :class:`PeakTracker` reads
the peak just before each reset and folds it into every open stage, so each
stage's peak is the most the process held between its begin and its end.
Standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

__all__ = ["Gauge", "PeakTracker"]


class Gauge(Protocol):
    """Figures now and their peaks since the last reset, in the same order."""

    def read(self) -> tuple[Sequence[int], Sequence[int]] | None: ...

    def reset(self) -> bool: ...


class PeakTracker:
    """Each open stage's peaks (see the module docstring)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._lock = threading.Lock()
        self._open: dict[int, list[int]] = {}  # a stage's seq -> its peaks so far
        self.resets = True  # False once a reset failed: peaks are then begin and end only

    def begin(self, seq: int) -> list[int] | None:
        """The stage ``seq`` begins: the figures now (None when the gauge cannot be read)."""
        with self._lock:
            read = self.gauge.read()
            if read is None:
                return None
            now, peaks = list(read[0]), list(read[1])
            for so_far in self._open.values():  # the stages already open keep what they reached
                so_far[:] = [max(a, b) for a, b in zip(so_far, peaks, strict=True)]
            self._open[seq] = list(now)
            if self.resets and not self.gauge.reset():
                self.resets = False
            return now

    def end(self, seq: int) -> tuple[list[int], list[int]] | None:
        """The stage ``seq`` ends: (the figures now, its peaks); None when unreadable."""
        with self._lock:
            read = self.gauge.read()
            so_far = self._open.pop(seq, None)
            if read is None:
                return None
            now, peaks = list(read[0]), list(read[1])
            if not self.resets:
                peaks = now  # no reset: a peak since the process began says nothing of this stage
            reached = [max(p, n) for p, n in zip(peaks, now, strict=True)]
            if so_far is not None:
                reached = [max(r, s) for r, s in zip(reached, so_far, strict=True)]
            return now, reached
