"""The op triage names (:class:`Finding`), placed in its module and source line."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from verl_events.observers.msprobe import layout

from .dumps import MODULE_ENTRY, Session, forward_of, runs_in_a_module_call, user_frame

__all__ = ["Finding", "place"]


@dataclass(slots=True)
class Finding:
    """The op triage names: entry, the parts that show the problem, its
    module, source frame and the parameter it read."""

    op: str
    parts: list[str]
    module: str | None = None  # the module's path, e.g. "fc1"
    module_entry: str | None = None
    no_module: str | None = None  # when module is None: why this dump names none, in words
    parameter: str | None = None  # e.g. "fc1.weight"
    source: dict[str, Any] | None = None
    factor: float | None = None  # spike: how much its outputs moved (>= 1, either way; output_moves)
    parameter_factor: float | None = None  # spike: how much the parameter moved (parameter_moves)
    largest: tuple[str, float] | None = None  # spike: the op that moved most, when not this one
    others: float | None = None  # spike, a parameter that jumped: the median move of the other parameters

    def as_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "parts": self.parts,
            "module": self.module,
            "module_entry": self.module_entry,
            "no_module": self.no_module,
            "parameter": self.parameter,
            "source": self.source,
            "factor": _json_number(self.factor),
            "parameter_factor": _json_number(self.parameter_factor),
            "largest": None
            if self.largest is None
            else {"op": self.largest[0], "factor": _json_number(self.largest[1])},
        }


def place(finding: Finding, session: Session) -> None:
    """Fill in the finding's module and source from the session's construct and stack."""
    forward = forward_of(finding.op)
    module_entry = forward if forward.startswith("Module.") else session.parents.get(forward)
    if module_entry and (match := MODULE_ENTRY.match(module_entry)):
        finding.module, finding.module_entry = match["path"], forward_of(module_entry)
    frames = session.stacks.get(finding.op) or session.stacks.get(forward) or []
    finding.source = user_frame(frames)
    if finding.module is None:
        finding.no_module = _why_no_module(session, frames)


def _why_no_module(session: Session, frames: list[str]) -> str:
    """The one reason, of those msprobe has, that the op has no module in this dump."""
    if not any(entry.startswith("Module.") for entry in session.entries):
        return "none recorded: the dump holds no module entries (level L1 records torch API calls only)"
    if not session.parents:
        missing = f"no {layout.CONSTRUCT_FILE} beside the dump"
        return f"none recorded: {missing} (msprobe's extra_info off, or a session cut off)"
    if not frames:
        return (
            "none recorded, and no call stack to tell why: it ran in the root model's own forward "
            "(msprobe never hooks the root model) or outside every module's forward"
        )
    if runs_in_a_module_call(frames):
        return (
            "none: it ran in a module msprobe does not hook "
            "(the root model's own forward, or a model msprobe was not given)"
        )
    return "none: it ran outside every module's forward"


def _json_number(value: float | None) -> float | str | None:
    """Strict JSON, as anomalies.jsonl writes it: ``"inf"`` for an infinite factor."""
    return value if value is None or math.isfinite(value) else str(value)
