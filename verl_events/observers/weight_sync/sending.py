"""What one sync sent, payload by payload, and all of it together.

verl sends a sync's tensors through the rollout adapter (or a checkpoint engine) as one
payload, and its first LoRA sync as two: the base weights, then the adapter.  The observer
keeps a :class:`Sending` per payload as its tensors pass, and judges the sync as the
:class:`Sent` of all of them, so a NaN in the base weights is as much an alarm as one in the
adapter.  Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verl_events import Payload

from .judge import Entry, payload_kind

__all__ = ["Sending", "Sent"]


class Sending:
    """One payload's manifest as its tensors pass."""

    def __init__(self, payload: Payload) -> None:
        self.payload = payload
        self.manifest: dict[str, Entry] = {}
        self.seconds = 0.0
        self.complete = False


@dataclass(frozen=True, slots=True)
class Sent:
    """A sync's payloads together: one manifest (a name sent twice counts as last sent), the
    names of each kind of payload (:func:`~.judge.payload_kind`), complete when every payload
    was, an adapter sync when any payload carried a LoRA config, ``last`` the last payload
    (its step, where it was seen, whether the engine had loaded it when the call returned)."""

    manifest: dict[str, Entry]
    kinds: dict[str, frozenset[str]]
    complete: bool
    adapter: bool
    seconds: float
    payloads: int
    last: Payload

    @classmethod
    def of(cls, payloads: Sequence[Sending]) -> Sent:
        manifest: dict[str, Entry] = {}
        kinds: dict[str, set[str]] = {}
        for sending in payloads:
            manifest.update(sending.manifest)
            kinds.setdefault(payload_kind(sending.manifest), set()).update(sending.manifest)
        return cls(
            manifest=manifest,
            kinds={kind: frozenset(names) for kind, names in kinds.items()},
            complete=all(sending.complete for sending in payloads),
            adapter=any(sending.payload.adapter for sending in payloads),
            seconds=sum(sending.seconds for sending in payloads),
            payloads=len(payloads),
            last=payloads[-1].payload,
        )
