"""verl's generation as a stage, on the driver: ``rollout_generate`` and ``rollout_validate``.

On verl 0.9's default (v1) trainer no worker method runs the rollout for a step.  The
driver (the ``TaskRunner`` process that runs the trainer's loop) hands the step's prompts to
the agent loop workers, which generate on their own, and then waits in its replay buffer's
``sample(global_steps=N, partition_id=..., batch_size=...)`` until enough trajectories are
finished.  That wait is the step's generation as the trainer lives it (verl's own ``gen``
timer wraps the same call), in all three trainer modes.  The bridge wraps ``sample`` of
``ReplayBuffer`` and of each subclass (verl's ``ReplayBufferAsync``, a user's
``custom_sampler``) with :func:`generation`:

| partition | stage | step |
| --- | --- | --- |
| ``train`` (or any but ``val``) | ``rollout_generate`` | ``global_steps`` |
| ``val`` | ``rollout_validate`` | ``global_steps`` (0 before training) |

The stage is filed under :data:`~verl_events.events.stages.DRIVER_RANK`: the driver is no
trainer rank, and under rank 0 its heartbeat would replace trainer rank 0's.  A generation
that never finishes is a stage that never ends there, so the watchdog's deadline names it;
an exception the sampler raises ends the stage with it.

A subclass whose ``sample`` calls its parent's is one stage, not two.  Nothing here may
stop training: a step that is not a step is passed over.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_events.bus.emit import stage
from verl_events.events.stages import DRIVER_RANK

from .transitions import argument, nested_in_itself, step_or_none

ROLLOUT_GENERATE = "rollout_generate"
ROLLOUT_VALIDATE = "rollout_validate"
#: The replay buffer's partition of validation prompts.
VALIDATION_PARTITION = "val"


def generation(sample: Callable[..., Any]) -> Callable[..., Any]:
    """A replay buffer's ``sample(global_steps, partition_id, batch_size)`` as the driver's stage."""
    global_steps = argument(sample, "global_steps")
    partition = argument(sample, "partition_id")

    @functools.wraps(sample)
    def generating(*args: Any, **kwargs: Any) -> Any:
        if nested_in_itself(ROLLOUT_GENERATE) or nested_in_itself(ROLLOUT_VALIDATE):
            return sample(*args, **kwargs)
        part = partition(args, kwargs)
        name = ROLLOUT_VALIDATE if part == VALIDATION_PARTITION else ROLLOUT_GENERATE
        step = step_or_none(global_steps(args, kwargs))
        with stage(name, step=step, rank=DRIVER_RANK, partition=part if isinstance(part, str) else None):
            return sample(*args, **kwargs)

    return generating
