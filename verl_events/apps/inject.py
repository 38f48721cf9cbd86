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

from verl_events import ConfigError, Observer, StageEnd, StageEvent
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


class SyncFault(Observer):
    """A weight-sync fault, to try the weight_sync observer on the CPU trainer.

    As a config entry, listed *after* ``weight_sync`` (so that its end hook runs first and
    the fault is in place when the observer takes the engine's receipt)::

        - _target_: verl_events.apps.inject:SyncFault
          kind: engine_keeps   # see below
          step: 2
          ranks: [0]

    * ``stale_payload``: step ``step``'s ``actor_update`` runs, then this rank's weights get
      back the values they had before it, so the sync after it sends the previous payload
      again although the optimizer stepped;
    * ``engine_keeps``: the rollout engine keeps one tensor's old value through sync ``step``
      (``parameter``, by default the engine model's first Linear weight): its value from
      before the sync is written back after loading, in the engine's process;
    * ``engine_alters``: after sync ``step`` loads, the engine's weights of layer ``layer``
      are multiplied by ``scale``, in the engine's process.

    The engine-side kinds reach the CPU rollout's server through
    :func:`verl_events.apps.verl_cpu.hf_rollout.run_on_server`.  Passive.
    """

    needs_model = False
    passive = True
    KINDS = ("stale_payload", "engine_keeps", "engine_alters")

    def __init__(
        self,
        kind: str,
        step: int,
        parameter: str | None = None,
        layer: int = 0,
        scale: float = 1.01,
    ) -> None:
        if kind not in self.KINDS:
            raise ConfigError(f"option kind: {kind!r} is not allowed; use one of {', '.join(self.KINDS)}")
        check_count(step, "option step", allowed="a step number >= 0", minimum=0)
        check_count(layer, "option layer", allowed="a layer number >= 0", minimum=0)
        self.kind, self.step, self.parameter, self.layer, self.scale = kind, step, parameter, layer, scale
        self._saved: list[tuple[Any, Any]] = []

    def on_stage_begin(self, event: StageEvent) -> None:
        if event.step != self.step or event.replay:
            return
        if self.kind == "stale_payload" and event.stage == "actor_update" and event.model is not None:
            self._saved = _local_copies(event.model)
        elif self.kind == "engine_keeps" and event.stage == "update_weights":
            _on_engine(event.rank, _engine_remember, self.parameter)

    def on_stage_end(self, event: StageEnd) -> None:
        if event.step != self.step or event.replay:
            return
        if self.kind == "stale_payload" and event.stage == "actor_update" and self._saved:
            _put_back(self._saved)
            self._saved = []
            logger.warning("injected: step %d's actor_update undone on rank %d", self.step, event.rank)
        elif self.kind != "stale_payload" and event.stage == "update_weights":
            if self.kind == "engine_keeps":
                name = _on_engine(event.rank, _engine_put_back)
                logger.warning("injected: the engine kept %s's old value through sync %d", name, self.step)
            else:
                names = _on_engine(event.rank, _engine_scale, self.layer, self.scale)
                logger.warning(
                    "injected: %d engine tensors of layer %d scaled by %g", len(names), self.layer, self.scale
                )

    def describe(self) -> str:
        return f"a weight-sync fault ({self.kind}) at step {self.step}: for trying weight_sync, never for training"


def _local_copies(model: Any) -> list[tuple[Any, Any]]:
    from torch.distributed.tensor import DTensor

    module = model[0] if isinstance(model, (list, tuple)) else model
    saved = []
    for parameter in module.parameters():
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter  # FSDP2: this rank's shard
        saved.append((local, local.detach().clone()))
    return saved


def _put_back(saved: list[tuple[Any, Any]]) -> None:
    import torch

    with torch.no_grad():
        for local, values in saved:
            local.copy_(values)


def _on_engine(rank: int, function: Any, *args: Any) -> Any:
    from .verl_cpu.hf_rollout import run_on_server

    return run_on_server(rank, function, *args)


# The engine-side halves run in the server's process, on the HFRolloutServer (Ray's __ray_call__).


def _engine_remember(server: Any, parameter: str | None) -> str:
    import torch

    name = parameter
    if name is None:
        name = next(f"{n}.weight" for n, m in server.model.named_modules() if isinstance(m, torch.nn.Linear))
    server._verl_events_kept = (name, server.model.get_parameter(name).detach().clone())
    return name


def _engine_put_back(server: Any) -> str:
    import torch

    name, values = server._verl_events_kept
    with torch.no_grad():
        server.model.get_parameter(name).copy_(values)
    return str(name)


def _engine_scale(server: Any, layer: int, scale: float) -> list[str]:
    import torch

    marker = f"layers.{layer}."
    names = [name for name, _ in server.model.named_parameters() if marker in name]
    with torch.no_grad():
        for name in names:
            server.model.get_parameter(name).mul_(scale)
    return names
