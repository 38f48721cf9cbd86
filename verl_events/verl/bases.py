"""The verl base classes the bridge patches when verl imports their module, and with what.

Each entry: the module that defines the base, the base's name, the wrapper of each method
(a wrapper that returns None leaves that method as it is), and whether the base's own
methods are wrapped too.  The subclasses' own methods always are, including subclasses
defined later (verl imports vLLM's adapter when the worker builds it, a custom engine's or
sampler's module when the config names it).

- the rollout adapters' wake-up and weight load (async): :mod:`._verl_transitions`;
- the checkpoint engines' send: :mod:`._verl_transitions`;
- the driver's replay buffer's wait for generation: :mod:`._verl_generation`;
- the driver's trainer loop (v1's ``PPOTrainer``, v0's ``RayPPOTrainer``): the step it
  resumed from and the step it reached, :mod:`.training`.

The replay buffer's own ``sample`` is what runs, so it is wrapped; the others' base methods
are abstract, and a subclass calling one through ``super()`` would show its weights twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import training, transitions
from .generation import generation


def _async_only(wrap: Callable[..., Any]) -> Callable[..., Any]:
    """``wrap`` for an async method; None (left as it is) for any other."""
    return lambda method: wrap(method) if inspect.iscoroutinefunction(method) else None


def _sync_only(wrap: Callable[..., Any]) -> Callable[..., Any]:
    """``wrap`` for a plain method; None (left as it is) for an async one."""
    return lambda method: None if inspect.iscoroutinefunction(method) else wrap(method)


#: The trainer's loop, v1's and v0's alike: its own methods, which subclasses inherit.
_TRAINER_LOOP: dict[str, Callable[..., Any]] = {
    "fit": _sync_only(training.fit),
    "_load_checkpoint": _sync_only(training.load_checkpoint),
}

BASES: dict[str, tuple[str, dict[str, Callable[..., Any]], bool]] = {
    "verl.workers.rollout.base": (
        "BaseRollout",
        {"resume": _async_only(transitions.wake_up), "update_weights": _async_only(transitions.sending)},
        False,
    ),
    "verl.checkpoint_engine.base": ("CheckpointEngine", {"send_weights": transitions.engine_sending}, False),
    "verl.trainer.ppo.v1.replay_buffer": ("ReplayBuffer", {"sample": _sync_only(generation)}, True),
    "verl.trainer.ppo.v1.trainer_base": ("PPOTrainer", _TRAINER_LOOP, True),
    "verl.trainer.ppo.ray_trainer": ("RayPPOTrainer", _TRAINER_LOOP, True),
}
