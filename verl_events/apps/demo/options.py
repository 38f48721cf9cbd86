"""What a demo run is asked to do: its default config, its options and the fault it injects.

Standard library only (no torch), so that the CLI can check a demo's
options and config before a model is built; both engines share
:func:`default_config` and :func:`preflight`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import verl_events

__all__ = ["INJECTED_WEIGHT", "SPIKE_SCALE", "DemoOptions", "Injection", "default_config", "preflight"]

INJECTED_WEIGHT = "blocks.1.mlp.0.weight"  # what --perturb and --inject change
SPIKE_SCALE = 50.0


def default_config(save_path: str) -> dict[str, Any]:
    """msprobe statistics at L1 on steps 1-2 for the actor and ref stages;
    timing on every stage of every step."""
    return {
        "save_path": save_path,
        "observers": [
            {"name": "timing"},
            {
                "name": "msprobe",
                "steps": ["1-2"],
                "stages": ["actor_compute_log_prob", "ref_compute_log_prob", "actor_update"],
            },
        ],
    }


@dataclass(frozen=True)
class Injection:
    """``--inject KIND@STEP``: corrupt ``INJECTED_WEIGHT`` of the actor on the last rank
    at the begin of ``step``'s actor update (nan: one element; spike: times
    ``SPIKE_SCALE``), through the :class:`~verl_events.apps.inject.WeightFault` observer."""

    kind: str
    step: int

    KINDS = ("nan", "spike")

    @classmethod
    def parse(cls, text: str, steps: int) -> Injection:
        kind, _, step = text.partition("@")
        if kind not in cls.KINDS or not step.isdigit() or not 1 <= int(step) <= steps:
            raise ValueError(
                f"--inject: {text!r} is not allowed; use nan@STEP or spike@STEP with STEP from 1 to {steps} (--steps)"
            )
        return cls(kind, int(step))

    def observer_entry(self, nproc: int) -> dict[str, Any]:
        # The last rank only: the others see the fault through the averaged gradients.
        return {
            "_target_": "verl_events.apps.inject:WeightFault",
            "kind": self.kind,
            "step": self.step,
            "parameter": INJECTED_WEIGHT,
            "scale": SPIKE_SCALE,
            "stages": ["actor_update"],
            "ranks": [nproc - 1],
        }


@dataclass(frozen=True)
class DemoOptions:
    config: dict[str, Any]
    steps: int
    nproc: int
    seed: int
    perturb: float = 0.0
    port: int = 0
    inject: Injection | None = None


def preflight(config: dict[str, Any]) -> None:
    """Build the observers once here and close them, so that a config that would
    fail (msprobe missing, a save path holding another run's files) stops the demo
    before its worker processes start, where it would end in a traceback.
    Raises :class:`ConfigError` or :class:`ObserverSetupError`."""
    with verl_events.install(config):
        pass
