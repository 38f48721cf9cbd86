"""Before it happens: a stage's memory growth against the step's tokens, and a warning
when this step's size predicts more than is left.

What is learned
---------------

For each stage (by name, on each rank) and each step it ran without error: how far
its peak rose above where it began (**growth**; host: the resident peak over the
resident memory at begin; device: the reserved peak over the reserved bytes at
begin) and how many tokens the step's batch held (:mod:`..batch.tokens`: prompt and
response tokens present).  A stage's first run is left out: it is warm-up
(optimizer state, caches, the allocator's pools), not a function of the batch.

From two later runs with different token counts on, a straight line
``growth = a + b × tokens`` is fitted by least squares; the expected growth at
``tokens`` is the line's value, and never less than the largest growth already
seen at as many tokens or fewer (so a flat or falling line still expects what
was seen).

What is compared
----------------

When a stage begins and its step's tokens are known (a stage of the same step on
this rank ended with the batch: in verl, ``actor_compute_log_prob``, which is
therefore not forecast itself), the expected growth is compared with what is left:

* host: the memory cgroup's limit less its usage; the address-space limit
  (``RLIMIT_AS``) less the process's size (growth in resident memory is taken as
  growth in address space: fresh allocations are both); the node's
  ``MemAvailable``.  The smallest is the headroom.
* device: its total less its used bytes (every process's).

What is left is read when the expectation needs it, and not again for
:data:`ROOM_FRESH_S` while the expectations stay at most :data:`ROOM_MARGIN` of
it (a warning is then missed only if what is left halves within that second).

A warning is one :class:`Forecast`: logged, sent as an anomaly (so it can arm a
capture before the stage fails), and kept in the stage's memory record.  It fires
only when the expectation exceeds the headroom; a healthy run far from its limits
never warns.

Thread safety: the caller serialises :meth:`Forecaster.learn` and
:meth:`Forecaster.expect` per rank and stage (the observer holds a lock).
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_events import AnomalyEvent, send_anomaly

from ..batch import token_counts
from .kernel_file import KernelFile

__all__ = ["Forecast", "Forecaster", "Headroom", "HostRoom", "StepForecast", "warn"]

logger = logging.getLogger("verl_events.memory")

#: Runs of a stage left out before learning: its first is warm-up.
WARM_UP_RUNS = 1
#: Observations kept per stage and kind: the most recent ones.
KEPT = 64


@dataclass(frozen=True, slots=True)
class Headroom:
    """What is left before a limit, and which limit it is."""

    bytes: int
    limit: str  # "cgroup", "RLIMIT_AS", "MemAvailable", "device"


@dataclass(frozen=True, slots=True)
class Forecast:
    """A stage expected to need more than is left (see the module docstring)."""

    stage: str
    kind: str  # "host" or "device"
    tokens: int
    expected_bytes: int
    headroom: Headroom
    seen_tokens: int
    seen_bytes: int

    def sentence(self, step: int | None, rank: int) -> str:
        return (
            f"memory: {self.stage} grew the {self.kind} memory by {_size(self.seen_bytes)} for "
            f"{self.seen_tokens:,} tokens; step {step} has {self.tokens:,} tokens: expect "
            f"{_size(self.expected_bytes)} more, and {_size(self.headroom.bytes)} is left under "
            f"{_LIMIT_NOUNS[self.headroom.limit]} (rank {rank})"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "tokens": self.tokens,
            "expected_bytes": self.expected_bytes,
            "headroom_bytes": self.headroom.bytes,
            "limit": self.headroom.limit,
            "seen_tokens": self.seen_tokens,
            "seen_bytes": self.seen_bytes,
        }


_LIMIT_NOUNS = {
    "cgroup": "the cgroup's limit",
    "RLIMIT_AS": "the address-space limit (RLIMIT_AS)",
    "MemAvailable": "the node's available memory",
    "device": "the device's total",
}


class Forecaster:
    """Growth against tokens per (rank, stage, kind), and the expectation for a new step."""

    def __init__(self) -> None:
        self._runs: dict[tuple[int, str], int] = {}
        self._seen: dict[tuple[int, str, str], list[tuple[int, int]]] = {}

    def learn(self, rank: int, stage: str, tokens: int, growth: dict[str, int]) -> None:
        """Stage ``stage`` ran on ``tokens`` tokens and grew by ``growth`` (by kind)."""
        runs = self._runs[(rank, stage)] = self._runs.get((rank, stage), 0) + 1
        if runs <= WARM_UP_RUNS:
            return
        for kind, grew in growth.items():
            seen = self._seen.setdefault((rank, stage, kind), [])
            seen.append((tokens, max(grew, 0)))
            del seen[:-KEPT]

    def expect(self, rank: int, stage: str, kind: str, tokens: int) -> tuple[int, int, int] | None:
        """(expected growth, tokens and growth of the largest run seen) at ``tokens``; None
        before two runs with different token counts were seen."""
        seen = self._seen.get((rank, stage, kind))
        if not seen or len({t for t, _ in seen}) < 2:
            return None
        n = len(seen)
        mean_t = sum(t for t, _ in seen) / n
        mean_g = sum(g for _, g in seen) / n
        spread = sum((t - mean_t) ** 2 for t, _ in seen)
        slope = sum((t - mean_t) * (g - mean_g) for t, g in seen) / spread
        line = mean_g + slope * (tokens - mean_t)
        floor = max((g for t, g in seen if t <= tokens), default=0)
        largest = max(seen)  # the most tokens, and of those the largest growth
        return max(int(line), floor), largest[0], largest[1]


#: What is left is read again at most this long after the last read, unless the expectation is
#: far below it (:data:`ROOM_MARGIN`): to miss a warning, what is left must halve in that time.
ROOM_FRESH_S = 1.0
ROOM_MARGIN = 0.5


class StepForecast:
    """The observer's side of the forecast: each rank's step tokens, what each stage grew
    by, and the warnings for a stage about to begin.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forecaster = Forecaster()
        self._step_tokens: dict[int, tuple[int, int]] = {}  # rank -> (step, its tokens)
        self._rooms: dict[str, tuple[float, Headroom]] = {}  # kind -> (monotonic, what was left then)
        self._failure_logged = False

    def check(
        self,
        stage: str,
        step: int,
        rank: int,
        host_room: Callable[[], Headroom | None],
        device_room: Callable[[], Headroom | None],
    ) -> list[Forecast]:
        """The warnings for ``stage`` beginning at ``step`` on ``rank``; what is left is asked
        for (``host_room``, ``device_room``) only when there is an expectation to compare."""
        known = self._step_tokens.get(rank)  # one dict lookup, atomic: most stages stop here
        if known is None or known[0] != step:
            return []
        tokens = known[1]
        with self._lock:
            expected = {kind: self._forecaster.expect(rank, stage, kind, tokens) for kind in ("host", "device")}
        found: list[Forecast] = []
        for kind, room in (("host", host_room), ("device", device_room)):
            expectation = expected[kind]
            if expectation is None or self._far_below(kind, expectation[0]):
                continue
            headroom = room()
            if headroom is not None:
                self._rooms[kind] = (time.monotonic(), headroom)
            if headroom is not None and expectation[0] > headroom.bytes:
                found.append(Forecast(stage, kind, tokens, expectation[0], headroom, expectation[1], expectation[2]))
        return found

    def _far_below(self, kind: str, expected_bytes: int) -> bool:
        """Whether ``expected_bytes`` is at most :data:`ROOM_MARGIN` of what was left at a read
        less than :data:`ROOM_FRESH_S` ago: what is left is then not read again (reading it is
        most of a stage's forecast cost: a cgroup's files, ``/proc/meminfo``)."""
        read = self._rooms.get(kind)
        return (
            read is not None
            and time.monotonic() - read[0] < ROOM_FRESH_S
            and expected_bytes <= read[1].bytes * ROOM_MARGIN
        )

    def step_tokens(self, stage: str, step: int | None, rank: int, inputs: Any, result: Any) -> int | None:
        """The tokens of ``step`` on ``rank``, counted from this stage's ``inputs`` or
        ``result`` when no earlier stage of the step gave them; None when unknown.  Runs on the
        stage's own thread (it may read a tensor); never raises."""
        if step is None:
            return None
        known = self._step_tokens.get(rank)  # one dict lookup, atomic
        if known is not None and known[0] == step:
            return known[1]
        try:
            for value in (inputs, result):
                counts = token_counts(value) if value is not None else None
                if counts is not None:
                    with self._lock:
                        self._step_tokens[rank] = (step, counts.tokens)
                    return counts.tokens
        except Exception as exc:
            if not self._failure_logged:
                self._failure_logged = True
                logger.warning(
                    "memory: could not count the tokens of stage %s's batch (%s: %s); the forecast skips such "
                    "batches, and later failures are not logged",
                    stage,
                    type(exc).__name__,
                    exc,
                )
        return None

    def learn(self, stage: str, rank: int, tokens: int, growth: dict[str, int]) -> None:
        with self._lock:
            self._forecaster.learn(rank, stage, tokens, growth)


def warn(found: list[Forecast], step: int, rank: int) -> None:
    """Log each warning and send it as an anomaly (metric ``memory_forecast/<kind>_bytes``)."""
    for warning in found:
        sentence = warning.sentence(step, rank)
        logger.warning("%s", sentence)
        event = AnomalyEvent(
            step=step,
            stage=warning.stage,
            rank=rank,
            metric=f"memory_forecast/{warning.kind}_bytes",
            value=float(warning.expected_bytes),
            rule="forecast",
            baseline=float(warning.headroom.bytes),
            detail=sentence,
        )
        send_anomaly(event, sender="memory", strict=False)


class HostRoom:
    """The smallest of the host's headrooms (see the module docstring), or None when none is
    known; its ``/proc`` files kept open (:mod:`.kernel_file`)."""

    def __init__(self) -> None:
        self._statm = KernelFile(Path("/proc/self/statm"))
        self._meminfo = KernelFile(Path("/proc/meminfo"))

    def headroom(self, cgroup_limit: int | None, cgroup_usage: int | None) -> Headroom | None:
        found: list[Headroom] = []
        if cgroup_limit is not None and cgroup_usage is not None:
            found.append(Headroom(cgroup_limit - cgroup_usage, "cgroup"))
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        size = self._address_space() if soft != resource.RLIM_INFINITY else None
        if size is not None:
            found.append(Headroom(soft - size, "RLIMIT_AS"))
        available = self._mem_available()
        if available is not None:
            found.append(Headroom(available, "MemAvailable"))
        return min(found, key=lambda h: h.bytes) if found else None

    def close(self) -> None:
        self._statm.close()
        self._meminfo.close()

    def _address_space(self) -> int | None:
        """The process's size (VmSize) in bytes, from ``/proc/self/statm``."""
        try:
            return int((self._statm.read(256) or b"").split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, IndexError):
            return None

    def _mem_available(self) -> int | None:
        text = self._meminfo.read(16384) or b""
        try:
            return int(text[text.index(b"MemAvailable:") + 13 :].split(None, 1)[0]) * 1024
        except (ValueError, IndexError):
            return None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.1f} KiB"
