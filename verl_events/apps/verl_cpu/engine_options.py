"""The options that point the mismatch and weight_sync observers at this job's rollout server.

Both observers ask the rollout engine for something in the engine's own process: the
mismatch observer's prefill (``prefill_engine``), the weight_sync observer's receipt and
canary (``receipt_engine``, ``canary_engine``).  They name no engine by default, since
they cannot know which one a run serves with; a config for the CPU job names this one, the
``hf`` rollout server of :mod:`.hf_rollout`.  :func:`with_rollout_engines` does it for
``verl-events demo --engine verl`` and for the tests that run the job, and
docs/mismatch.md and docs/weight-sync.md show the same options written out.

Standard library only: the demo's command calls it before verl or torch is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ROLLOUT_ENGINES", "with_rollout_engines"]

_SERVER = "verl_events.apps.verl_cpu.hf_rollout"

#: Each observer's engine options for this job, by the observer's name.
ROLLOUT_ENGINES: Mapping[str, Mapping[str, str]] = {
    "mismatch": {"prefill_engine": f"{_SERVER}:request_prefill"},
    "weight_sync": {"receipt_engine": f"{_SERVER}:request_receipt", "canary_engine": f"{_SERVER}:request_canary"},
}


def with_rollout_engines(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (our form) with each ``mismatch`` and ``weight_sync`` entry of its
    ``observers`` given this job's engine options (:data:`ROLLOUT_ENGINES`) that the entry
    does not set itself: an entry's own value, ``null`` included, wins.  Other entries, and
    the observers a preset adds (they ask no engine), are left as they are; ``config`` is
    not changed."""
    result = dict(config)
    if isinstance(config.get("observers"), list):
        result["observers"] = [_with_engine(entry) for entry in config["observers"]]
    return result


def _with_engine(entry: Any) -> Any:
    name = entry.get("name") if isinstance(entry, Mapping) else None
    options = ROLLOUT_ENGINES.get(name) if isinstance(name, str) else None
    if options is None:
        return entry
    return {**entry, **{key: value for key, value in options.items() if key not in entry}}
