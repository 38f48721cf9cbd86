"""An agent loop that fails in generation, for verl's real trainer: a user's agent loop is where a
rollout stalls (a tool call that takes minutes) or raises.  verl loads it by the ``_target_`` of
``rollout.agent.agent_loop_config_path`` (:func:`agent_loop_overrides`) in its agent loop worker,
which imports this module by path (``PYTHONPATH`` holds the repository)."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

with warnings.catch_warnings():  # verl's rollout package imports Ray's state API, which warns that it moved
    warnings.simplefilter("ignore", DeprecationWarning)
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

#: The step where one prompt's tool call stalls for :data:`STALL_S`, then returns.
STALLING_STEP = 2
STALL_S = 25.0
#: The step where every prompt's tool call raises.
RAISING_STEP = 3


class StallThenRaise(SingleTurnAgentLoop):
    """verl's single-turn loop with a tool call first: at :data:`STALLING_STEP` the first prompt's
    stalls, at :data:`RAISING_STEP` every prompt's raises.  verl builds a loop per prompt, in one
    agent loop worker (the CPU job runs one): the stall is remembered on the class."""

    stalled = False

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        step = kwargs.get("global_steps")
        if step == STALLING_STEP and not StallThenRaise.stalled:
            StallThenRaise.stalled = True
            await asyncio.sleep(STALL_S)
        if step == RAISING_STEP:
            raise ConnectionError(f"the search tool refused the connection at step {RAISING_STEP}")
        return await super().run(sampling_params, **kwargs)


def agent_loop_overrides(root: Path) -> list[str]:
    """verl overrides that make :class:`StallThenRaise` every prompt's agent loop."""
    config = root / "agent_loops.yaml"
    name = StallThenRaise.__name__
    config.write_text(json.dumps([{"name": name, "_target_": f"{__name__}.{name}"}]))  # JSON is YAML
    rollout = "actor_rollout_ref.rollout.agent"
    return [f"{rollout}.agent_loop_config_path={config}", f"{rollout}.default_agent_loop={name}"]
