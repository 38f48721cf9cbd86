"""Checkpoint faults made to happen for real inside verl's trainer ranks: users' observers
(``_target_: tests.checkpoint_faults:...``) that change what torch does while a
``save_checkpoint`` or ``load_checkpoint`` stage is open on their rank.

* :class:`StaleOptimizerSave`: from the second save on, ``Optimizer.state_dict()`` returns
  a copy taken at the first (NeMo RL #4183: every checkpoint after the first holds the
  same optimizer bytes);
* :class:`SkipOptimizerLoad`: ``Optimizer.load_state_dict`` does nothing during the load
  (a load that restores the model and not the optimizer);
* :class:`KillInSave`: at the save of ``step``, the optimizer's file is written, cut to
  half its size, and the process is SIGKILLed, the way a preemption or the OOM killer ends
  a save.

Each puts torch back at the stage's end.  tests/test_verl_checkpoints.py runs them.
"""

from __future__ import annotations

import copy
import os
import signal
from typing import Any

import torch

from verl_events import Observer, StageEnd, StageEvent


class _DuringStage(Observer):
    """Replaces ``owner.attribute`` with ``replacement(original)`` while a selected stage is open."""

    passive = True
    owner: Any = None
    attribute = ""

    def __init__(self) -> None:
        self._original: Any = None

    def replacement(self, original: Any, event: StageEvent) -> Any | None:
        raise NotImplementedError

    def on_stage_begin(self, event: StageEvent) -> None:
        original = getattr(self.owner, self.attribute)
        replacement = self.replacement(original, event)
        if replacement is not None:
            self._original = original
            setattr(self.owner, self.attribute, replacement)

    def on_stage_end(self, event: StageEnd) -> None:
        if self._original is not None:
            setattr(self.owner, self.attribute, self._original)
            self._original = None


class StaleOptimizerSave(_DuringStage):
    owner, attribute = torch.optim.Optimizer, "state_dict"

    def __init__(self) -> None:
        super().__init__()
        self._first: Any = None

    def replacement(self, original: Any, event: StageEvent) -> Any:
        fault = self

        def state_dict(optimizer: Any) -> Any:
            if fault._first is None:
                fault._first = copy.deepcopy(original(optimizer))
                return original(optimizer)
            return fault._first

        return state_dict


class SkipOptimizerLoad(_DuringStage):
    owner, attribute = torch.optim.Optimizer, "load_state_dict"

    def replacement(self, original: Any, event: StageEvent) -> Any:
        return lambda optimizer, state_dict: None


class KillInSave(_DuringStage):
    owner, attribute = torch, "save"

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def replacement(self, original: Any, event: StageEvent) -> Any | None:
        if event.step != self.step:
            return None

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(obj, f, *args, **kwargs)
            if os.path.basename(str(f)).startswith("optim"):
                os.truncate(f, os.path.getsize(f) // 2)
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        return save
