"""``peak: sampled``: the process-wide peaks read by a thread, not by the stage's hooks.

In the default ``peak: reset`` the hooks themselves reset the peaks when a
stage begins and read them when it ends (:mod:`.peaks`): exact, at some
tens of µs of the training thread's time per stage.  Here a thread does
that every ``interval_s`` instead, and the hooks only note the stage:

* every interval the thread reads each gauge's peak since its last reset
  (the host's ``VmHWM``, the allocator's), resets it, and folds it into
  every stage that was open during the interval, ended ones included;
* a stage that ended is finished (its line written) at the first sample
  after its end, so its peak covers all of it.

Nothing is missed, however short the spike: each interval's peak is the
kernel's or the allocator's own high-water mark.  What it blurs: a stage's
peak also covers the rest of the intervals it began and ended in, up to one
interval before its begin and after its end.  Its line is written up to one
interval after it ended, on the thread; :meth:`Sampler.stop` finishes what
is left (the observer's ``close``, at exit too); a process killed in between
loses the lines of the stages that ended in its last interval.

Standard library only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .peaks import Gauge

__all__ = ["Sampler"]


class Sampler:
    """The sampling thread (see the module docstring)."""

    def __init__(
        self,
        gauges: Sequence[Gauge | None],
        interval_s: float,
        finish: Callable[[Any, list[list[int] | None], list[list[int] | None]], None],
    ) -> None:
        self._gauges = list(gauges)
        self._interval = interval_s
        self._finish = finish  # (what end() was given, the peaks per gauge, the figures now per gauge), on the thread
        self._lock = threading.Lock()
        self._open: dict[int, list[list[int] | None]] = {}  # seq -> peaks per gauge so far
        self._ended: list[tuple[list[list[int] | None], Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = -1
        self.latest: list[tuple[Sequence[int], Sequence[int]] | None] = [None] * len(self._gauges)
        self.resets = [True] * len(self._gauges)  # False once a gauge's reset failed: its figure now is folded

    def set_gauge(self, index: int, gauge: Gauge) -> None:
        """A gauge found late (the device: torch may be imported after the observer starts)."""
        read = gauge.read()
        self.resets[index] = gauge.reset()  # from here on, its peak is the interval's
        with self._lock:
            self._gauges[index] = gauge
            self.latest[index] = read

    def begin(self, seq: int) -> None:
        if self._pid != os.getpid():
            self._start()
        with self._lock:
            self._open[seq] = [None] * len(self._gauges)

    def end(self, seq: int, payload: Any) -> None:
        """Stage ``seq`` ended: ``payload`` goes to ``finish`` with its peaks at the next sample."""
        with self._lock:
            peaks = self._open.pop(seq, None)
            self._ended.append((peaks if peaks is not None else [None] * len(self._gauges), payload))

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
        reads: list[Sequence[int] | None] = []
        latest = list(self.latest)
        for index, gauge in enumerate(gauges):
            read = gauge.read() if gauge is not None else None
            # Without a reset the peak is the process's since it began: only the figure now says anything.
            reads.append(None if read is None else read[1] if self.resets[index] else read[0])
            if read is not None:
                latest[index] = read
                if self.resets[index] and not gauge.reset():  # type: ignore[union-attr]
                    self.resets[index] = False
        with self._lock:
            self.latest = latest
            for peaks in (*self._open.values(), *(peaks for peaks, _ in self._ended)):
                for index, figure in enumerate(reads):
                    if figure is not None:
                        so_far = peaks[index]
                        peaks[index] = list(figure) if so_far is None else _larger(so_far, figure)
            ended, self._ended = self._ended, []
        now = [list(read[0]) if read is not None else None for read in latest]
        for peaks, payload in ended:
            self._finish(payload, peaks, now)

    def _start(self) -> None:
        # A forked child has no thread of its parent's: each process starts its own, from its
        # own peaks (reset now: until then they are the process's since it began).
        with self._lock:
            if self._pid != -1:
                self._open.clear()
                self._ended.clear()
            gauges = list(self._gauges)
        self.resets = [gauge.reset() if gauge is not None else True for gauge in gauges]
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verl-events-memory-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()


def _larger(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return [max(x, y) for x, y in zip(a, b, strict=True)]
