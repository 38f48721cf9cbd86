"""The weight-sync ledger, ``{save_path}/weight_sync.jsonl``: one line per sync and rank.

This module owns the format; the ``weight_sync`` observer writes it and
``verl-events weights`` and ``verl-events diagnose`` read it back, both
through the names here.  A line is a :class:`SyncRecord`::

    {"run": "ray-0a1b", "step": 2, "rank": 0, "time": 1796025667.1, "complete": true,
     "tensors": 290, "bytes": 1976131584, "adapter": false, "adapter_tensors": 0,
     "changed": 290, "unchanged": [], "optimizer_stepped": true, "nonfinite": [],
     "receipt": {"tensors": 291, "compared": 290, "same_dtype": true,
                 "missing": [], "differs": [], "not_updated": []},
     "canary": {"max": 3.1e-07, "mean": 4.2e-08, "layers": [1.1e-07, 2.3e-07], "tolerance": 0.001,
                "first_layer": null},
     "alarms": [], "seconds": {"manifest": 0.41, "receipt": 0.52, "canary": 0.08},
     "seen_at": "the rollout adapter's update_weights", "unchecked": null, "payloads": 1}

``changed`` is how many tensors differ from the previous sync this rank
sent (null at the first one); ``unchanged`` names the others (at most
:data:`NAMES_KEPT`).  ``receipt`` is what the engine holds after the sync
(null without one); ``canary`` the canary's comparison (null without one;
its ``tolerance`` is null at the rank's first check, the baseline: see
:mod:`.canary`); each alarm is an :class:`Alarm`.  ``seen_at`` names the
call the tensors were seen passing (the rollout adapter's
``update_weights``, or a checkpoint engine's ``send_weights``); ``payloads`` how many
payloads the sync sent through it (verl's first LoRA sync sends the base weights, then
the adapter: 2), all of them in the line's counts and judged.  A sync
whose tensors passed nowhere this rank watches still has its line:
``unchecked`` says why, with no tensor counted and nothing judged.  Lines are appended
with one ``write`` on an ``O_APPEND`` descriptor, so the ranks' lines never
interleave.  Standard library only.
"""

from __future__ import annotations

import builtins
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verl_events import Record

__all__ = [
    "ALARM_KINDS",
    "NAMES_KEPT",
    "STAGE",
    "WEIGHT_SYNC_LOG",
    "Alarm",
    "NotASyncRecord",
    "SyncRecord",
    "weight_sync_files",
    "weight_sync_log_path",
]

WEIGHT_SYNC_LOG = "weight_sync.jsonl"
#: The stage a sync runs in (verl_events.verl.transitions.WEIGHT_SYNC).
STAGE = "update_weights"
#: Tensor names kept per list in a line: a model has hundreds; the count says how many there were.
NAMES_KEPT = 20

#: Each alarm's kind, and what it says.
ALARM_KINDS = {
    "stale_payload": "the payload did not change although the optimizer stepped",
    "not_applied": "sent, but the engine holds no tensor of that name",
    "differs": "the engine's tensor differs from what was sent",
    "not_updated": "the engine's tensor did not change although the sync changed it",
    "no_adapter": "LoRA is on but no adapter tensor was sent",
    "nonfinite": "the payload holds NaN or infinite values",
    "missing": "sent at the previous sync, left out of this one: the engine keeps its old value",
    "canary": "the engine's log-probs of the canary sequences are past the tolerance from the trainer's",
}


def weight_sync_log_path(save_path: Path) -> Path:
    return Path(save_path) / WEIGHT_SYNC_LOG


def weight_sync_files(save_path: Path) -> list[Path]:
    """The run's ledger under ``save_path``, if it exists."""
    log = weight_sync_log_path(save_path)
    return [log] if log.exists() else []


class NotASyncRecord(ValueError):
    """A line that is not a weight-sync record; the message says what it lacks."""


@dataclass(frozen=True, slots=True)
class Alarm:
    """What went wrong at one sync: ``kind`` (a key of :data:`ALARM_KINDS`), the tensors
    (at most :data:`NAMES_KEPT` names; ``count`` says how many), the first layer they are
    in, and a sentence."""

    kind: str
    tensors: list[str]
    count: int
    layer: str | None
    detail: str


#: The keys a line of the ledger always holds.
_REQUIRED = (
    "run",
    "step",
    "rank",
    "time",
    "complete",
    "tensors",
    "bytes",
    "adapter",
    "adapter_tensors",
    "changed",
    "unchanged",
    "optimizer_stepped",
    "nonfinite",
    "receipt",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncRecord(Record):
    """One sync on one rank (see the module docstring)."""

    run: str
    step: int | None
    rank: int
    time: float
    complete: bool
    tensors: int
    bytes: int
    adapter: bool
    adapter_tensors: int
    changed: int | None
    unchanged: list[str]
    optimizer_stepped: bool | None
    nonfinite: list[str]
    receipt: dict[str, Any] | None
    canary: dict[str, Any] | None = None
    alarms: list[Alarm] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    seen_at: str | None = None
    unchecked: str | None = None
    payloads: int = 1

    @classmethod
    def not_seen(cls, *, run: str, step: int | None, rank: int, time: float, why: str) -> SyncRecord:
        """The line of a sync none of whose tensors could be seen: nothing counted, nothing judged."""
        return cls(
            run=run,
            step=step,
            rank=rank,
            time=time,
            complete=False,
            tensors=0,
            bytes=0,
            adapter=False,
            adapter_tensors=0,
            changed=None,
            unchanged=[],
            optimizer_stepped=None,
            nonfinite=[],
            receipt=None,
            unchecked=why,
            payloads=0,
        )

    noun = "a weight-sync record"
    not_negative = ("tensors", "bytes", "adapter_tensors", "changed", "payloads")
    refused = NotASyncRecord
    required = _REQUIRED
    numbers = ("seconds",)

    def as_dict(self) -> dict[str, Any]:
        return Record.as_dict(self) | {"alarms": [asdict(alarm) for alarm in self.alarms]}

    @classmethod
    def from_json(cls, line: str | builtins.bytes) -> SyncRecord:
        data = cls.parsed(line)
        for name in ("seen_at", "unchecked"):
            if not isinstance(data.get(name), str | None):
                raise NotASyncRecord(f"its {name} is neither text nor null")
        payloads = data.get("payloads", 1)
        if isinstance(payloads, bool) or not isinstance(payloads, int) or payloads < 0:
            raise NotASyncRecord(f"its payloads is {payloads!r}, not a count")
        try:
            alarms = [Alarm(**alarm) for alarm in data.get("alarms") or []]
        except TypeError as exc:
            raise NotASyncRecord(f"not a weight-sync record ({exc})") from None
        return cls.known(data | {"alarms": alarms})
