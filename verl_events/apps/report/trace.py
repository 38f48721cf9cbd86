"""``verl-events report --trace``: a run's stages as a Chrome/Perfetto trace, from its timing logs."""

from __future__ import annotations

from typing import Any

from .overhead import TimingRecord

__all__ = ["chrome_trace"]


def chrome_trace(records: list[TimingRecord]) -> dict[str, Any]:
    """A Chrome/Perfetto trace: one track per rank, a slice per stage, and
    inside it the observers' begin hooks, the body and their end hooks; the
    slice of a stage that raised names the exception (``args.error``)."""
    events: list[dict[str, Any]] = []
    for rank in sorted({r.rank for r in records}):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
    for record in records:
        begins, ends = record.hook_begin_s, record.hook_end_s
        total = sum(begins.values()) + record.elapsed_s + sum(ends.values())
        # Without the wall clock (older logs) the slices start at 0.
        start = ((total if record.end_unix is None else record.end_unix) - total) * 1e6
        common = {"ph": "X", "pid": record.rank, "tid": 0}
        args: dict[str, Any] = {
            "step": record.step,
            "profiled_by": list(record.profiled_by),
            "dump_bytes": record.dump_bytes,
        }
        if record.error is not None:  # the stage raised: its slice says what
            args["error"] = record.error
        events.append({**common, "name": record.stage, "ts": start, "dur": total * 1e6, "args": args})
        cursor = start
        # Older logs do not list the observers; those with a begin hook time did receive it.
        observers = list(begins if record.observers is None else record.observers)
        pieces = [(f"{name} begin", begins.get(name, 0.0)) for name in observers]
        pieces.append(("body", record.elapsed_s))
        pieces += [(f"{name} end", ends.get(name, 0.0)) for name in reversed(observers)]
        for name, seconds in pieces:
            events.append(
                {
                    **common,
                    "name": name,
                    "ts": cursor,
                    "dur": seconds * 1e6,
                    "cat": "hook" if name != "body" else "body",
                }
            )
            cursor += seconds * 1e6
    return {"traceEvents": events, "displayTimeUnit": "ms"}
