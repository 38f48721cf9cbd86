"""A fault injector, to try the anomaly sentinel: an observer that corrupts one weight.

``verl-events demo --inject nan@5`` adds it to the demo's config; the real-verl test adds
it to a trainer run.  As a config entry::

    - _target_: verl_events.apps.inject:WeightFault
      kind: nan          # nan: one element becomes NaN; spike: the weight is multiplied by scale
      step: 5
      stages: [actor_update]
      lasts: run         # run: the fault stays; stage: undone after the stage and its replay;
                         # call: undone when the stage's own run ends, before any replay

It acts once, at the begin of the first selected stage of ``step``, on the stage's model
(``event.model``): ``parameter`` names the weight, by default the first Linear layer's.  Under
FSDP a parameter is a DTensor; its local shard is changed, which on one rank is all of it.

``lasts`` makes the one-off faults a replay tells apart (docs/sentinel.md, "Replay"):
``stage`` is a fault of that step's inputs or weights, which a replay with the same ones shows
again (reproducible), and is undone at the end of the replay, or at the next stage this
observer receives when nothing replays; ``call`` is a fault of that one run, which the replay
does not see (transient).  The weight gets its own values back, so training goes on healthy.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

from verl_events import Observer, StageEnd, StageEvent
from verl_events.config import check_count

logger = logging.getLogger("verl_events.inject")


class WeightFault(Observer):
    """Corrupts one weight of the stage's model at ``step`` (see the module docstring).

    Passive: it records nothing, so a stage it sees still counts as unprofiled
    in the timing log and stays in the overhead table's baseline.
    """

    needs_model = True
    passive = True
    sees_replays = True  # lasts: stage is undone at the end of the replay

    def __init__(
        self,
        kind: Literal["nan", "spike"],
        step: int,
        parameter: str | None = None,
        scale: float = 50.0,
        lasts: Literal["run", "stage", "call"] = "run",
    ) -> None:
        check_count(step, "step", allowed="a step number >= 1")
        self.kind, self.step, self.parameter, self.scale, self.lasts = kind, step, parameter, scale, lasts
        self.done = False
        self._lock = threading.Lock()
        self._undo: tuple[Any, Any, int] | None = None  # (the weight's local tensor, its own values, the stage's seq)

    def on_stage_begin(self, event: StageEvent) -> None:
        if self._undo is not None and not event.replay and event.seq != self._undo[2]:
            self._restore()  # lasts: stage, and no replay came
        if event.step != self.step or event.model is None or event.replay:
            return
        with self._lock:
            if self.done:
                return
            self.done = True
        name, weight = self._weight(event.model)
        import torch
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            local = weight.to_local() if isinstance(weight, DTensor) else weight  # FSDP2: this rank's shard
            if self.lasts != "run":
                self._undo = (local, local.detach().clone(), event.seq)
            if self.kind == "nan":
                local.view(-1)[0] = float("nan")
            else:
                local.mul_(self.scale)
        logger.warning(
            "injected %s into %s at step %d, stage %r, rank %d",
            "a NaN" if self.kind == "nan" else f"a x{self.scale:g} spike",
            name,
            self.step,
            event.stage,
            event.rank,
        )

    def on_stage_end(self, event: StageEnd) -> None:
        if self._undo is None:
            return
        if (self.lasts == "call" and event.seq == self._undo[2]) or (self.lasts == "stage" and event.replay):
            self._restore()

    def close(self) -> None:
        if self._undo is not None:
            self._restore()

    def _restore(self) -> None:
        import torch

        undo, self._undo = self._undo, None
        if undo is not None:
            with torch.no_grad():
                undo[0].copy_(undo[1])
            logger.warning("the injected fault is undone: the weight has its own values again")

    def _weight(self, model: Any) -> tuple[str, Any]:
        import torch

        module = model[0] if isinstance(model, (list, tuple)) else model
        if self.parameter is not None:
            return self.parameter, module.get_parameter(self.parameter)
        # A Linear's weight: every token goes through it, where one embedding row
        # would only matter to the batches that hold its token.
        for name, layer in module.named_modules():
            if isinstance(layer, torch.nn.Linear):
                return f"{name}.weight", layer.weight
        raise ValueError(f"{type(module).__name__} has no Linear layer to corrupt; name a weight with parameter:")

    def describe(self) -> str:
        return (
            f"corrupts a weight ({self.kind}, lasts: {self.lasts}) at step {self.step}: "
            "for trying the sentinel, never for training"
        )
