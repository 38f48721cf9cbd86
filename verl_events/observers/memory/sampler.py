"""``peak: sampled``: every figure read by a thread, not by the stage's hooks.

In the default ``peak: reset`` the hooks themselves read the figures and reset
the peaks when a stage begins, and read them again when it ends
(:mod:`.peaks`): exact, at some tens of µs of the training thread's time per
stage.  Here a thread does all of that every ``interval_s``, and the hooks
only note the stage in a table:

* every interval the thread reads each gauge (the figure now and its peak
  since its last reset: the host's ``VmRSS`` and ``VmHWM``, the allocator's),
  resets it, and folds the peak into every stage that was open during the
  interval, ended ones included;
* a stage's begin figures are those of the last sample before it began, its
  end figures those of the first sample after it ended, when its line is
  written (its peak then covers all of it).

No spike is missed, however short: each interval's peak is the kernel's or
the allocator's own high-water mark.  What it blurs: a stage's peak also
covers the rest of the intervals it began and ended in, and its begin and
end figures are up to one interval early and late.  Its line is written up
to one interval after it ended, on the thread; :meth:`Sampler.stop` finishes
what is left (the observer's ``close``, at exit too); a process killed in
between loses the lines of the stages that ended in its last interval.

Standard library only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .peaks import Gauge

__all__ = ["Figures", "Sampler"]

Figures = list[list[int] | None]  # one gauge's figures (or None: not read), per gauge


class Sampler:
    """The sampling thread (see the module docstring).

    ``finish(payload, begin, end, peaks)`` gets, on the thread, what :meth:`end` was given and
    the stage's figures per gauge: at its begin, at its end, and its peaks."""

    def __init__(
        self,
        gauges: Sequence[Gauge | None],
        interval_s: float,
        finish: Callable[[Any, Figures, Figures, Figures], None],
    ) -> None:
        self._gauges = list(gauges)
        self._interval = interval_s
        self._finish = finish
        self._lock = threading.Lock()
        self._open: dict[int, tuple[Figures, Figures]] = {}  # seq -> (figures at begin, peaks so far)
        self._ended: list[tuple[Figures, Figures, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = -1
        self._now: Figures = [None] * len(self._gauges)  # each gauge's figures at the latest sample
        self.resets = [True] * len(self._gauges)  # False once a gauge's reset failed: its figure now is folded

    def set_gauge(self, index: int, gauge: Gauge) -> None:
        """A gauge found late (the device: torch may be imported after the observer starts)."""
        read = gauge.read()
        self.resets[index] = gauge.reset()  # from here on, its peak is the interval's
        with self._lock:
            self._gauges[index] = gauge
            self._now = [*self._now[:index], list(read[0]) if read else None, *self._now[index + 1 :]]

    def begin(self, seq: int) -> None:
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            self._open[seq] = (self._now, [None] * len(self._gauges))

    def end(self, seq: int, payload: Any) -> None:
        """Stage ``seq`` ended: ``payload`` goes to ``finish`` at the next sample."""
        with self._lock:
            begin, peaks = self._open.pop(seq, (self._now, [None] * len(self._gauges)))
            self._ended.append((begin, peaks, payload))

    def stop(self) -> None:
        """Stop the thread and finish every stage that ended."""
        self._stop.set()
        if self._thread is not None and self._pid == os.getpid():
            self._thread.join()
        self._thread = None
        self.sample()

    def sample(self) -> None:
        """Read and reset each gauge, fold its peak into the stages open during the interval,
        and finish the ones that ended."""
        with self._lock:
            gauges = list(self._gauges)
        now: Figures = []
        folded: Figures = []
        for index, gauge in enumerate(gauges):
            read = gauge.read() if gauge is not None else None
            now.append(list(read[0]) if read is not None else None)
            # Without a reset the peak is the process's since it began: only the figure now says anything.
            folded.append(None if read is None else list(read[1] if self.resets[index] else read[0]))
            if read is not None and self.resets[index] and not gauge.reset():  # type: ignore[union-attr]
                self.resets[index] = False
        with self._lock:
            self._now = now  # replaced, never changed in place: a stage's begin keeps its own
            for _, peaks in (*self._open.values(), *((p, q) for p, q, _ in self._ended)):
                for index, figure in enumerate(folded):
                    if figure is not None:
                        so_far = peaks[index]
                        peaks[index] = figure if so_far is None else _larger(so_far, figure)
            ended, self._ended = self._ended, []
        for begin, peaks, payload in ended:
            self._finish(payload, begin, now, peaks)

    def _start(self) -> None:
        # A forked child has no thread of its parent's: each process starts its own, from its
        # own figures (the peaks reset now: until then they are the process's since it began).
        with self._lock:
            if self._pid != -1:
                self._open.clear()
                self._ended.clear()
            gauges = list(self._gauges)
        reads = [gauge.read() if gauge is not None else None for gauge in gauges]
        self.resets = [gauge.reset() if gauge is not None else True for gauge in gauges]
        with self._lock:
            self._now = [list(read[0]) if read is not None else None for read in reads]
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verl-events-memory-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()


def _larger(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return [max(x, y) for x, y in zip(a, b, strict=True)]
