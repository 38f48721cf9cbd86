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
    """``--inject KIND@STEP``: corrupt ``INJECTED_WEIGHT`` of the actor on the last rank,
    through the :class:`~verl_events.apps.inject.WeightFault` observer:

    * ``nan`` / ``spike``: at the begin of ``step``'s actor update, for good (one element
      NaN; the weight times ``SPIKE_SCALE``);
    * ``nan-once``: a NaN in ``step``'s actor_compute_log_prob only, there through its
      replay and undone after (a fault of the step's weights: reproducible);
    * ``nan-flaky``: the same, undone as soon as the stage's own run ends, so its replay
      runs clean (a fault of that one run: transient).
    """

    kind: str
    step: int

    #: Each kind: (the fault, the stage it hits, how long it lasts).
    KINDS = {
        "nan": ("nan", "actor_update", "run"),
        "spike": ("spike", "actor_update", "run"),
        "nan-once": ("nan", "actor_compute_log_prob", "stage"),
        "nan-flaky": ("nan", "actor_compute_log_prob", "call"),
    }

    @classmethod
    def parse(cls, text: str, steps: int) -> Injection:
        kind, _, step = text.partition("@")
        if kind not in cls.KINDS or not step.isdigit() or not 1 <= int(step) <= steps:
            raise ValueError(
                f"--inject: {text!r} is not allowed; use KIND@STEP with KIND one of {', '.join(cls.KINDS)} "
                f"and STEP from 1 to {steps} (--steps)"
            )
        return cls(kind, int(step))

    def observer_entry(self, nproc: int) -> dict[str, Any]:
        fault, stage, lasts = self.KINDS[self.kind]
        # The last rank only: the others see the fault through the averaged gradients.
        return {
            "_target_": "verl_events.apps.inject:WeightFault",
            "kind": fault,
            "step": self.step,
            "parameter": INJECTED_WEIGHT,
            "scale": SPIKE_SCALE,
            "lasts": lasts,
            "stages": [stage],
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
