"""The text of a hang report, ``hangs/step_{N}_{stage}_rank{R}.txt`` (:mod:`.monitor` writes it)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from verl_events import rank_name

from .record import HangRecord
from .stacks import ThreadStack, describe_where

__all__ = ["report_text"]


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def report_text(record: HangRecord, stacks: list[ThreadStack], entry: Any, multiple: float, exit_code: int) -> str:
    """What the report of ``record`` says: the stage, where its thread is, then every thread's
    stack.  ``entry`` is the monitor's open stage (its deadline's kind, thread and event),
    ``multiple`` the adaptive deadline's, ``exit_code`` the one ``action: abort`` ends with."""
    how = {
        "fixed": "timeout_s",
        "first": "first_s: the stage's first time in this process",
        "adaptive": f"{multiple:g} x its longest so far, at least floor_s",
    }[entry.how]
    shown = describe_where(record.where)
    who = rank_name(record.rank) + (f" of {entry.event.world_size}" if record.rank >= 0 else "")
    lines = [
        "verl-events watchdog: a stage passed its deadline",
        f"run: {record.run}",
        f"step {record.step}, stage {record.stage} (role {record.role}), {who}, "
        f"pid {record.pid} on {record.host}, thread {record.thread}",
        f"began {_iso(record.began)}; had run {record.elapsed_s:.1f} s at {_iso(record.time)}; "
        f"deadline {record.deadline_s:g} s ({how})",
        f"user code: {shown or 'none in the stage thread (every frame is a library)'}",
        f"waiting in: {record.waiting_in or 'no torch.distributed call'}",
        f"pending collective: {record.collective}",
        f"action: {record.action}"
        + (f" (this process ends with exit code {exit_code})" if record.action == "abort" else ""),
        "",
        "Stacks, outermost frame first; '>>' marks each thread's innermost frame of user code.",
    ]
    for stack in stacks:
        mark = " (the stage's thread)" if stack.ident == entry.thread else ""
        lines += ["", f"Thread {stack.name}{mark}:", *stack.render()]
    return "\n".join(lines) + "\n"
