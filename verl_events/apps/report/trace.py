"""``verl-events report --trace``: a run's stages as a Chrome/Perfetto trace, from its timing logs.

Times are written from the run's first stage start (``otherData.origin_unix_s``), not from the
Unix epoch: at 1.8e15 us a double resolves only a quarter of a microsecond, so a hook's end and
the next slice's start would no longer meet, and Perfetto drops a slice that ends after the one
it starts in.  Every boundary of a stage is one integer nanosecond (its hooks and body share
their edges exactly), written in microseconds a quarter nanosecond past it: a reader that
truncates to whole nanoseconds (Perfetto's JSON import) and one that rounds read the same
integer, so nested slices stay nested and neighbours meet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ..read.overhead import TimingRecord

__all__ = ["Marked", "chrome_trace"]


class Marked(Protocol):
    """What the timeline marks as an instant: a failure as ``verl-events diagnose`` reads it
    (:class:`verl_events.apps.read.record.Failure`: an exception, a signal, a killed
    rank, a hang, an anomaly)."""

    @property
    def kind(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def time(self) -> float: ...
    @property
    def detail(self) -> str: ...
    @property
    def step(self) -> int | None: ...
    @property
    def stage(self) -> str | None: ...
    @property
    def source(self) -> str: ...


def chrome_trace(records: list[TimingRecord], marks: Iterable[Marked] = ()) -> dict[str, Any]:
    """A Chrome/Perfetto trace: one track per rank, a slice per stage, and inside it the
    observers' begin hooks, the body and their end hooks; the slice of a stage that raised
    names the exception (``args.error``).  A global instant marks where each step began
    (its first stage start on any rank), and an instant on a rank's track each of
    ``marks`` (one without a time, 0, is left out: there is nowhere to put it)."""
    starts = [_start(record) for record in records]
    origin = min((start for start in starts if start is not None), default=0.0)
    events: list[dict[str, Any]] = []
    marks = [mark for mark in marks if mark.time > 0]
    for rank in sorted({r.rank for r in records} | {m.rank for m in marks}):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
    step_starts: dict[int, int] = {}
    for record, start in zip(records, starts, strict=True):
        # Without the wall clock (older logs) the slices start at the origin.
        begin = 0 if start is None else _ns(start - origin)
        events += _stage_slices(record, begin)
        if record.step is not None and start is not None:
            step_starts[record.step] = min(begin, step_starts.get(record.step, begin))
    for step, begin in sorted(step_starts.items()):
        events.append({"ph": "i", "s": "g", "name": f"step {step}", "ts": _us(begin), "pid": 0, "tid": 0})
    for mark in marks:
        args = {"detail": mark.detail, "step": mark.step, "stage": mark.stage, "source": mark.source}
        name = f"{mark.kind}: {mark.stage}" if mark.stage else mark.kind
        at = _us(_ns(mark.time - origin))
        events.append({"ph": "i", "s": "t", "name": name, "cat": mark.kind, "ts": at, "pid": mark.rank, "tid": 0})
        events[-1]["args"] = args
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"origin_unix_s": origin}}


def _stage_slices(record: TimingRecord, begin: int) -> list[dict[str, Any]]:
    """The stage's slice and, edge to edge inside it, its hooks and body (integer ns from the origin)."""
    begins, ends = record.hook_begin_s, record.hook_end_s
    # Older logs do not list the observers; those with a begin hook time did receive it.
    observers = list(begins if record.observers is None else record.observers)
    pieces = [(f"{name} begin", begins.get(name, 0.0)) for name in observers]
    pieces.append(("body", record.elapsed_s))
    pieces += [(f"{name} end", ends.get(name, 0.0)) for name in reversed(observers)]
    edges = [begin]
    elapsed = 0.0
    for _, seconds in pieces:
        elapsed += seconds
        edges.append(begin + _ns(elapsed))  # from the stage's start: no rounding accumulates
    common = {"ph": "X", "pid": record.rank, "tid": 0}
    args: dict[str, Any] = {
        "step": record.step,
        "profiled_by": list(record.profiled_by),
        "dump_bytes": record.dump_bytes,
    }
    if record.error is not None:  # the stage raised: its slice says what
        args["error"] = record.error
    slices = [{**common, "name": record.stage, "ts": _us(begin), "dur": _us(edges[-1] - begin), "args": args}]
    for (name, _), start, end in zip(pieces, edges, edges[1:], strict=False):
        category = "body" if name == "body" else "hook"
        slices.append({**common, "name": name, "ts": _us(start), "dur": _us(end - start), "cat": category})
    return slices


def _start(record: TimingRecord) -> float | None:
    """When the stage began (Unix seconds): its line is written just after its last end hook."""
    if record.end_unix is None:
        return None
    return (
        float(record.end_unix) - sum(record.hook_begin_s.values()) - record.elapsed_s - sum(record.hook_end_s.values())
    )


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _us(ns: int) -> float:
    """Integer nanoseconds as the format's microseconds, a quarter nanosecond past: read back as
    ``int(us * 1000)`` or ``round(us * 1000)`` it gives ``ns`` again (a double's error there is
    far below a quarter)."""
    return (ns + 0.25) / 1000
