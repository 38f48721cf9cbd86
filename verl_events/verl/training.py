"""verl's trainer loop, on the driver: the step it resumed from and the step it reached.

The bridge wraps two methods of the trainer (v1's ``PPOTrainer`` and its subclasses, v0's
``RayPPOTrainer``), in the driver process that runs them:

* ``_load_checkpoint()``: once it returns, the trainer's ``global_steps`` is the step of
  the checkpoint it loaded (0 when it started fresh: ``resume_mode=disable``, or no
  checkpoint in ``default_local_dir``); kept on the trainer;
* ``fit(...)``: once it returns normally, :func:`verl_events.bus.progress.loop_ended` is told
  the step resumed from, ``total_training_steps`` and the last step the loop finished.
  verl advances ``global_steps`` past each step it finished (also past the last one), and
  once before the loop: the last finished step is ``global_steps - 1``.

Nothing here may stop training: a trainer without these attributes tells nobody.  The
wrappers name only module-level functions (Ray pickles classes by value).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from verl_events.bus.progress import LoopEnded, loop_ended

from .transitions import step_or_none

__all__ = ["fit", "load_checkpoint"]

logger = logging.getLogger("verl_events.verl")

#: Where the wrapper keeps, on the trainer, the step its ``_load_checkpoint`` resumed from.
_RESUMED = "_verl_events_resumed_from"
#: Set on the trainer while its outermost ``fit`` runs.
_FITTING = "_verl_events_fitting"


def _note(trainer: Any, name: str, value: Any) -> None:
    try:
        setattr(trainer, name, value)
    except Exception:  # a trainer with __slots__: its loop's end is told without this
        logger.debug("verl_events: cannot note %s on %r", name, type(trainer).__name__)


def load_checkpoint(method: Callable[..., Any]) -> Callable[..., Any]:
    """The driver's ``_load_checkpoint()``, noting the step it resumed from."""

    @functools.wraps(method)
    def loading(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        step = step_or_none(getattr(self, "global_steps", None))
        _note(self, _RESUMED, step if step else None)
        return result

    return loading


def fit(method: Callable[..., Any]) -> Callable[..., Any]:
    """The driver's ``fit(...)``, telling how far its loop went once it returned normally."""

    @functools.wraps(method)
    def fitting(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, _FITTING, False):  # a subclass's fit calling super().fit(): told once, by the outer
            return method(self, *args, **kwargs)
        _note(self, _FITTING, True)
        try:
            result = method(self, *args, **kwargs)
        finally:
            _note(self, _FITTING, False)
        ended = _loop_ended(self)
        if ended is not None:
            loop_ended(ended)
        return result

    return fitting


def _loop_ended(trainer: Any) -> LoopEnded | None:
    """How far ``trainer``'s loop went; None when that says nothing (no step counter, or a
    ``val_only`` run, which validates and trains nothing on purpose)."""
    steps = step_or_none(getattr(trainer, "global_steps", None))
    if steps is None or _validation_only(trainer):
        return None
    resumed = getattr(trainer, _RESUMED, None)
    return LoopEnded(
        resumed_from=resumed if isinstance(resumed, int) else None,
        total_steps=step_or_none(getattr(trainer, "total_training_steps", None)),
        last_step=max(0, steps - 1),
    )


def _validation_only(trainer: Any) -> bool:
    try:
        return bool(trainer.config.trainer.get("val_only", False))
    except Exception:  # a trainer without verl's config
        return False
