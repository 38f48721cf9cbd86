"""Finding a stage's step, rank and model, the way verl's profiler does.

The model candidate paths are the ones verl 0.9's precision debugger walks
(``verl/utils/profiler/precision_debugger_profile.py``), per role, ending
with ``module``.  Users extend them with :func:`add_model_paths`.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from verl_events.events.process import PROCESS

logger = logging.getLogger("verl_events")

_DEFAULT_MODEL_PATHS: dict[str, tuple[str, ...]] = {
    "actor": (
        "actor.engine.module",
        "actor.actor_module",
        "actor.actor_module_fsdp",
        "actor_module_fsdp",
        "actor_module",
    ),
    "ref": (
        "ref.engine.module",
        "ref.actor_module",
        "ref_policy.actor_module",
        "ref_module_fsdp",
        "ref_module",
        "ref_policy.ref_module",
    ),
    "critic": (
        "critic.engine.module",
        "critic.critic_module",
        "critic_module_fsdp",
        "critic_module",
    ),
    "reward_model": (
        "reward_model.engine.module",
        "reward_model_module_fsdp",
        "reward_model_module",
        "rm.reward_model_module",
    ),
}
_FALLBACK_PATHS = ("module",)

_paths_lock = threading.Lock()


def add_model_paths(role: str | None, *paths: str) -> None:
    """Try these dotted attribute paths first when looking for ``role``'s model.

    ``role=None`` adds paths for every role.  Thread-safe; takes effect for
    the next stage.
    """
    for path in paths:
        if not isinstance(path, str) or not all(part.isidentifier() for part in path.split(".")):
            raise ValueError(f"add_model_paths: {path!r} is not a dotted attribute path like 'actor.engine.module'")
    with _paths_lock:
        added = PROCESS.model_paths
        added[role] = tuple(dict.fromkeys(paths + added.get(role, ())))


def reset_model_paths() -> None:
    """Forget every path added with :func:`add_model_paths`."""
    with _paths_lock:
        PROCESS.model_paths.clear()


def model_paths(role: str | None) -> tuple[str, ...]:
    """The ordered candidate paths for ``role``: user paths, verl's, then ``module``."""
    added = PROCESS.model_paths
    user = added.get(role, ()) + (added.get(None, ()) if role is not None else ())
    default = _DEFAULT_MODEL_PATHS.get(role, ()) if role is not None else ()
    return tuple(dict.fromkeys(user + default + _FALLBACK_PATHS))


def _is_model(value: Any) -> bool:
    if isinstance(value, (list, tuple)):  # Megatron pipeline chunks
        return bool(value) and all(callable(getattr(v, "forward", None)) for v in value)
    return callable(getattr(value, "forward", None))


def _walk(obj: Any, path: str) -> Any:
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # properties of half-built workers may raise anything
            return None
    return obj


def find_model(worker: Any, role: str | None) -> tuple[Any, tuple[str, ...]]:
    """Return (model or None, paths tried).  The first path whose value has
    a callable ``forward`` (or is a list of such chunks) wins."""
    paths = model_paths(role)
    for path in paths:
        candidate = _walk(worker, path)
        if candidate is not None and _is_model(candidate):
            return candidate, paths
    return None, paths


def _as_step(value: Any) -> int | None:
    """``value`` as a step, or None if it is not one.

    The one rule for steps: a non-negative integer (``operator.index``, so
    numpy ints and 0-d integer tensors count); bool is not a step.
    """
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) == "torch.bool":
        return None  # operator.index accepts a 0-d bool tensor
    try:
        step = operator.index(value)
    except TypeError:
        return None
    return step if step >= 0 else None


def check_step(step: Any, where: str, stage: str | None = None) -> int | None:
    """``step`` as a plain int, None kept; ValueError for anything else.

    Shared by :func:`set_step` (``where="set_step"``) and ``stage(step=...)``
    (``where="stage"`` and the stage's name, put into the message only when
    it is raised) so both refuse the same values with the same sentence.
    """
    if step is None:
        return None
    checked = _as_step(step)
    if checked is None:
        if stage is not None:
            where = f"{where}({stage!r}, step=...)"
        raise ValueError(f"{where}: {step!r} is not a step; use a non-negative int, or None for no step")
    return checked


def find_step(worker: Any, args: Iterable[Any], kwargs: Mapping[str, Any]) -> int | None:
    """verl's order: a DataProto-like argument's ``meta_info["global_steps"]``,
    a dict argument's ``"global_steps"``, the worker's ``global_step`` /
    ``_global_step``, then the step announced with :func:`set_step`.

    Only a step counts (see :func:`check_step`); anything else is passed
    over and the search goes on.  verl 0.9's engine workers get a TensorDict
    whose ``"global_steps"`` is a per-sample list of the rollout's weight
    version (one behind the trainer's step): it is passed over.
    """
    for value in itertools.chain(args, kwargs.values()):
        if isinstance(value, Mapping):
            found = value["global_steps"] if "global_steps" in value else None
        else:
            try:
                meta = getattr(value, "meta_info", None)
            except Exception:
                continue
            found = meta.get("global_steps") if isinstance(meta, Mapping) else None
        step = None if found is None else _as_step(found)
        if step is not None:
            return step
    for attr in ("global_step", "_global_step"):
        step = _as_step(getattr(worker, attr, None))
        if step is not None:
            return step
    return PROCESS.announced_step


def set_step(step: int | None) -> None:
    """Announce the current global step for stages that cannot find one.

    Process-wide (a trainer announces it for all threads); None clears it.
    ValueError for anything that is not a step (see :func:`check_step`).
    """
    PROCESS.announced_step = check_step(step, "set_step")


def current_step() -> int | None:
    """The step announced with :func:`set_step`, or None."""
    return PROCESS.announced_step


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        if name not in PROCESS.warned_env:
            PROCESS.warned_env.add(name)
            logger.warning("environment variable %s=%r is not an integer; using %d", name, raw, default)
        return default


def find_rank() -> tuple[int, int]:
    """(rank, world size): torch.distributed when initialised, else the
    ``RANK`` / ``WORLD_SIZE`` environment variables, else (0, 1).

    Never imports torch: if nobody imported torch.distributed, it cannot be
    initialised.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
